"""Labelling block by block (``densecnn predict``): image files, image sets and chunked arrays too large for memory,
on Dask.

Needs the ``dist`` extra (``pip install 'densecnn[dist]'``: dask, distributed, zarr). Layout:

- :mod:`~densecnn.blockwise.blocks`: one output chunk from its input window with the halo of the receptive field.
- :mod:`~densecnn.blockwise.files`: one image of an image set.
- :mod:`~densecnn.blockwise.sinks`: zarr outputs written chunk by chunk (atomic, resumable).

Inputs are read and label files written by :mod:`densecnn.io` (lazily for arrays: only each task's window).
- :mod:`~densecnn.blockwise.worker`: the model, loaded once per worker process.
- :mod:`~densecnn.blockwise.run`: the driver (cluster, tasks in flight, retries, summary).

>>> from densecnn.blockwise import BlockwiseOptions, label
>>> print(label("models/nuclei", "slide.zarr", "slide-labels.zarr", BlockwiseOptions(workers=2)))
"""

from .run import BlockwiseOptions, Summary, label

__all__ = ["BlockwiseOptions", "Summary", "label"]
