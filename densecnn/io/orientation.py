"""The TIFF/EXIF Orientation tag: pixels as stored -> pixels as displayed, for whole arrays and for windows.

Every reader applies it, so an image is the same array whichever path reads it (an upload, ``densecnn predict``'s
chunked reads, training).
"""

from __future__ import annotations

import numpy as np

# Orientation value -> (transpose first?, flip rows?, flip columns?), as the TIFF and EXIF specifications define
# them (value 5-8: the stored rows are the displayed columns). Pillow's exif_transpose agrees.
ORIENTATIONS = {
    1: (False, False, False),
    2: (False, False, True),
    3: (False, True, True),
    4: (False, True, False),
    5: (True, False, False),
    6: (True, False, True),
    7: (True, True, True),
    8: (True, True, False),
}


def transposes(orientation: int) -> bool:
    """Whether the displayed rows are the stored columns (orientations 5-8)."""
    return ORIENTATIONS.get(orientation, ORIENTATIONS[1])[0]


def oriented(array: np.ndarray, orientation: int, rows: int = 0) -> np.ndarray:
    """(H, W[, S]) as stored -> as displayed under the Orientation value 1-8 (a view, no copy).

    ``rows`` is the axis of the rows (the columns follow it): (C, D, H, W) volumes are oriented with ``rows=2``.

    >>> oriented(np.arange(6).reshape(2, 3), 3)     # rotated by 180 degrees
    array([[5, 4, 3],
           [2, 1, 0]])
    """
    transpose, flip_rows, flip_columns = ORIENTATIONS.get(orientation, ORIENTATIONS[1])
    if transpose:
        array = np.swapaxes(array, rows, rows + 1)
    flips = [slice(None)] * array.ndim
    flips[rows] = slice(None, None, -1 if flip_rows else 1)
    flips[rows + 1] = slice(None, None, -1 if flip_columns else 1)
    return array[tuple(flips)]


def stored_window(window: tuple[slice, ...], shape: tuple[int, ...], orientation: int) -> tuple[slice, ...]:
    """The stored window whose pixels, oriented, are the displayed ``window`` (rows and columns: the last two).

    ``shape`` is the displayed spatial shape; ``window`` has one ``slice(start, stop)`` per spatial axis.

    >>> stored_window((slice(0, 2), slice(1, 3)), (4, 5), 3)      # rotated by 180 degrees
    (slice(2, 4, None), slice(2, 4, None))
    """
    if len(window) < 2:
        return window
    transpose, flip_rows, flip_columns = ORIENTATIONS.get(orientation, ORIENTATIONS[1])
    *lead, rows, columns = window
    if flip_rows:
        rows = slice(shape[-2] - rows.stop, shape[-2] - rows.start)
    if flip_columns:
        columns = slice(shape[-1] - columns.stop, shape[-1] - columns.start)
    return (*lead, columns, rows) if transpose else (*lead, rows, columns)
