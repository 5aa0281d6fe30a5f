"""``densecnn predict``: label image files, image sets and chunked arrays too large for memory, on Dask.

Needs the ``dist`` extra (``pip install 'densecnn[dist]'``: dask, distributed, zarr). Layout:

- :mod:`~densecnn.predict.blocks`: one output chunk from its input window with the halo of the receptive field.
- :mod:`~densecnn.predict.files`: one image of an image set.
- :mod:`~densecnn.predict.sinks`: zarr outputs written chunk by chunk (atomic, resumable).

Inputs are read and label files written by :mod:`densecnn.io` (lazily for arrays: only each task's window).
- :mod:`~densecnn.predict.worker`: the model, loaded once per worker process.
- :mod:`~densecnn.predict.run`: the driver (cluster, tasks in flight, retries, summary).

>>> from densecnn.predict import predict
>>> print(predict("models/nuclei", "slide.zarr", "slide-labels.zarr", workers=2))
"""

from .run import Summary, predict

__all__ = ["Summary", "predict"]
