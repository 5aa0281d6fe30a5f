"""napari's sample data: the 512×512 fluorescence image of nuclei the shipped ``nuclei`` model was trained on
(``stardist``'s ``img2d.tif``, 8-bit; columns 0–383 were its training region, 384–511 its validation region).

>>> [(pixels, meta)] = nuclei()
>>> pixels.shape, pixels.dtype, meta
((512, 512), dtype('uint8'), {'name': 'nuclei'})
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

NUCLEI_IMAGE = Path(__file__).resolve().parent / "nuclei.png"


def nuclei() -> list[tuple[np.ndarray, dict]]:
    """The image as napari's LayerData: [(pixels (512, 512) uint8, layer keyword arguments)]."""
    with Image.open(NUCLEI_IMAGE) as image:
        return [(np.asarray(image), {"name": "nuclei"})]
