"""Labelling block by block (``densecnn predict``): image files, image sets and chunked arrays too large for memory,
on Dask.

Needs the ``dist`` extra (``pip install 'densecnn[dist]'``: dask, distributed, zarr). Layout:

- :mod:`~densecnn.blockwise.options`: :class:`BlockwiseOptions`, from which ``densecnn predict``'s CLI is generated.
- :mod:`~densecnn.blockwise.run`: the driver, :func:`predict_to_disk`.
- :mod:`~densecnn.blockwise.inputs`: what the input is (file, set, chunked array; its level and channels).
- :mod:`~densecnn.blockwise.destinations`: no output is an input, holds one, or shares a path with another.
- :mod:`~densecnn.blockwise.provenance`: what an output was made from (model, options, the input as stored),
  checked before a re-run keeps it.
- :mod:`~densecnn.blockwise.cluster`: the Dask cluster joined or started, and the memory of a task there.
- :mod:`~densecnn.blockwise.scheduling`: tasks in flight, distributed's retries, failures, cancel, the counts.
- :mod:`~densecnn.blockwise.chunked`: a chunked array labelled (plan, outputs, blocks, pyramid);
  :mod:`~densecnn.blockwise.images`: image files labelled.
- :mod:`~densecnn.blockwise.planning`: output chunks, chunks per task, windows and their memory.
- :mod:`~densecnn.blockwise.blocks`: one output chunk from its input window with the halo of the receptive field.
- :mod:`~densecnn.blockwise.files`: one image of an image set.
- :mod:`~densecnn.blockwise.cancel`: stopping a run between blocks.
- :mod:`~densecnn.blockwise.sinks`: zarr outputs written chunk by chunk (atomic, resumable);
  :mod:`~densecnn.blockwise.ngff`: OME-Zarr outputs; :mod:`~densecnn.blockwise.foreground`: background skipping.
- :mod:`~densecnn.blockwise.worker`: the model, loaded once per worker process.
- :mod:`~densecnn.blockwise.summary`: what a run did.

Inputs are read and label files written by :mod:`densecnn.io` (lazily for arrays: only each task's window), and
every block is labelled through the loaded model's façade (:meth:`densecnn.LoadedModel.labels`).

>>> from densecnn.blockwise import BlockwiseOptions, predict_to_disk
>>> print(predict_to_disk("models/nuclei", "slide.zarr", "slide-labels.zarr", BlockwiseOptions(workers=2)))
"""

from .options import BlockwiseOptions
from .planning import estimate_task_memory
from .run import predict_to_disk
from .summary import Summary

__all__ = ["BlockwiseOptions", "Summary", "estimate_task_memory", "predict_to_disk"]
