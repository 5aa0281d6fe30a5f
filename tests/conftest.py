"""Shared test configuration: hypothesis profiles (CI runs derandomized, so failures reproduce), the ops settings."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from densecnn.ops.config import get_config, set_config

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
os.environ.setdefault("DENSECNN_CALIBRATE", "0")  # the shipped cost model as it is: no timing, plans alike


@pytest.fixture(scope="session", autouse=True)
def service_data_dir(tmp_path_factory):
    """The service's jobs, keys and database in a directory of the test session, never the user's (servers started
    as subprocesses inherit it)."""
    os.environ["DENSECNN_DATA_DIR"] = str(tmp_path_factory.mktemp("service-data"))


@pytest.fixture(autouse=True)
def environment_restored():
    """``densecnn serve`` sets DENSECNN_* variables for its worker processes: each test leaves the environment as it
    found it, so none of them reaches a later test in the same process."""
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before):
        del os.environ[name]
    os.environ.update(before)


@pytest.fixture
def ops_config():
    """Change the ops settings for one test: ``ops_config(solver="native", cache_dir=tmp_path)``; the config in effect
    before the test is back after it (densecnn reads the environment only once, at import)."""
    previous = get_config()
    yield lambda **changes: set_config(get_config().replace(**changes))
    set_config(previous)
