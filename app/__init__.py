"""The densecnn web service: POST an image, get its full-resolution label map back.

It lives in app/ in the repository and is imported, everywhere, as the package ``densecnn_app`` (``pip install
densecnn[serve]``, or the editable install ``make`` does; a top-level ``app`` would collide with users' own).

>>> from densecnn_app import Settings, create_app
>>> app = create_app(Settings(model_dir="models"))   # then: uvicorn, or `densecnn serve`
"""

from .main import create_app
from .settings import Settings

__all__ = ["Settings", "create_app"]
