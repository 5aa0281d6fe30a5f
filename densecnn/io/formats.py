"""What files densecnn reads and writes: format signatures, the suffixes of each kind of file, and file listings.

Every reader and writer of :mod:`densecnn.io` takes its suffixes from here, so the service, ``densecnn predict`` and
training accept the same files.
"""

from __future__ import annotations

import glob
from pathlib import Path

from ..errors import ImageReadError

TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders
SIGNATURES = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpeg": (b"\xff\xd8\xff",),
    "tiff": TIFF_MAGIC,
    "bmp": (b"BM",),
    "gif": (b"GIF87a", b"GIF89a"),
    "npy": (b"\x93NUMPY",),
}
ACCEPTED = "PNG, JPEG or TIFF (also WebP, BMP, GIF), or a .npy array"  # what an upload may be
NPY_KINDS = "biuf"  # bool, signed and unsigned integers, floats: the dtypes read as pixel values

IMAGE_SUFFIXES = (".png", ".tif", ".tiff", ".jpg", ".jpeg", ".webp", ".bmp")  # 2-D image files, decoded whole
TIFF_SUFFIXES = (".tif", ".tiff")
LABEL_IMAGE_SUFFIXES = (".png", ".tif", ".tiff")  # lossless images: label maps read for training
LABEL_SUFFIXES = (*LABEL_IMAGE_SUFFIXES, ".npy")  # label maps written (densecnn predict)
ARRAY_SUFFIXES = {1: (".npy",), 3: (".tif", ".tiff", ".npy", ".zarr")}  # signals and volumes, by spatial axes


def image_format(data: bytes) -> str | None:
    """The format whose signature ``data`` starts with ("png", "jpeg", "tiff", "bmp", "gif", "npy", "webp"), or
    None.

    >>> image_format(b"\\x89PNG\\r\\n\\x1a\\n...")
    'png'
    """
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":  # a RIFF container holding a WebP image
        return "webp"
    return next((fmt for fmt, magics in SIGNATURES.items() if data.startswith(magics)), None)


def is_zarr(path: str | Path) -> bool:
    """Whether ``path`` is a zarr array or group (v2 or v3) on disk.

    >>> is_zarr("slide.ome.zarr")
    True
    """
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in ("zarr.json", ".zarray", ".zgroup"))


def image_files(spec: str | Path) -> list[Path]:
    """The image files of a directory (not recursive) or a glob pattern, sorted by name.

    >>> image_files("fields/*.png")
    [PosixPath('fields/a.png'), PosixPath('fields/b.png')]

    Raises:
        ImageReadError: nothing matched, or a directory holds arrays (.npy, zarr) beside its images, which would
            be left unlabelled.
    """
    path = Path(spec)
    if path.is_dir():
        found = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
        arrays = sorted(p.name for p in path.iterdir() if p.suffix.lower() == ".npy" or is_zarr(p))
        if found and arrays:
            raise ImageReadError(
                f"{spec}: besides its images it holds arrays ({', '.join(arrays[:3])}"
                f"{', ...' if len(arrays) > 3 else ''}), which are labelled one at a time to a .zarr output, not "
                "with the images; move them out, or give a glob of the images such as 'fields/*.png'"
            )
    else:
        found = [Path(p) for p in glob.glob(str(spec)) if Path(p).is_file()]
    if not found:
        raise ImageReadError(
            f"{spec}: no image files found ({', '.join(IMAGE_SUFFIXES)}); give a directory of images or a glob "
            "such as 'fields/*.png'"
        )
    return sorted(found)
