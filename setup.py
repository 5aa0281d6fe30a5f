"""Build of densecnn's C++/CUDA extension (cuda_ext/); package metadata lives in pyproject.toml."""

from setuptools import setup

setup()
