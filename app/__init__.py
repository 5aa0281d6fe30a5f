"""The densecnn web service: POST an image, get its full-resolution label map back.

It lives in app/ in the repository and is installed as the package ``densecnn_app`` (``pip install densecnn[serve]``).

>>> from app import Settings, create_app
>>> app = create_app(Settings(model_dir="models"))   # then: uvicorn, or `densecnn serve`
"""

from .main import create_app
from .settings import Settings

__all__ = ["Settings", "create_app"]
