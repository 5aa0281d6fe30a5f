"""Shared test configuration: hypothesis profiles (CI runs derandomized, so failures reproduce)."""

import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    derandomize=True,
    print_blob=True,
)
settings.load_profile("ci" if os.environ.get("CI") else "default")
torch.set_num_threads(1)  # tests run 2 in parallel on 2 cores
