"""Reading and writing arrays: the one way densecnn turns files into model input and label maps into files.

The service, ``densecnn predict``, training and the CLI all read and write through this package, so the same file
gives the same array whichever path reads it (orientation applied, channels first, the same errors).

- :mod:`~densecnn.io.formats`: format signatures, the suffixes of each kind of file, image file listings.
- :mod:`~densecnn.io.arrays`: zarr / OME-Zarr, TIFF and .npy arrays opened lazily as one :class:`LazyArray` type
  (axes, pixel size, windows read on demand).
- :mod:`~densecnn.io.decode`: image files decoded whole, judged from their header against size limits first.
- :mod:`~densecnn.io.decode_nd`: uploads for models of any number of axes (TIFF stacks, .npy), channel first.
- :mod:`~densecnn.io.orientation`: the TIFF/EXIF Orientation tag, for whole arrays and windows.
- :mod:`~densecnn.io.intensity`: how raw values are scaled to [0, 1] (declared by the model, checked per image).
- :mod:`~densecnn.io.pixels`: decoded pixels -> a model's input (scaling, channels, normalisation).
- :mod:`~densecnn.io.labels`: label maps -> PNG, TIFF and .npy files; class probabilities.

Every reader raises :class:`~densecnn.errors.ImageReadError` (or a subclass) naming the file and the fix.

>>> from densecnn.io import open_lazy_array, read_nd
>>> open_lazy_array("stack.tif", spatial_dims=3).read().shape        # lazily, any window
(1, 12, 64, 64)
>>> read_nd(Path("stack.tif").read_bytes(), 3, max_bytes=10**8).shape   # eagerly, under limits
(1, 12, 64, 64)
"""

from .arrays import LazyArray, open_lazy_array
from .decode import ImageHeader, decode_array, read_header, read_image
from .decode_nd import read_nd
from .formats import ACCEPTED, image_files, image_format, is_zarr
from .intensity import Intensity, Scaling
from .labels import class_probabilities, label_dtype, labels_png, labels_tiff, write_labels
from .pixels import array_input, array_scaling, image_scaling, model_input, unit_planes

__all__ = [
    "ACCEPTED",
    "ImageHeader",
    "Intensity",
    "LazyArray",
    "Scaling",
    "array_input",
    "array_scaling",
    "class_probabilities",
    "decode_array",
    "image_files",
    "image_format",
    "image_scaling",
    "is_zarr",
    "label_dtype",
    "labels_png",
    "labels_tiff",
    "model_input",
    "open_lazy_array",
    "read_header",
    "read_image",
    "read_nd",
    "unit_planes",
    "write_labels",
]
