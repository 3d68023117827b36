import os

import pytest

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

HAS_CUDA = bool(torch is not None and torch.cuda.is_available())

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (none on this machine)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (none on this machine)"))


@pytest.fixture(autouse=True)
def _seed():
    if torch is not None:
        torch.manual_seed(0)
    yield


# Keep hypothesis fast and deterministic in CI.
try:
    from hypothesis import settings

    settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
    settings.register_profile("dev", max_examples=10, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass
