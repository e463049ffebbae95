"""Shared fixtures: the GPU devices the tests run on.

METALQWEN_TEST_DEVICES is a comma list of device kinds ("cpu", "metal"); it
defaults to "cpu", the runtime every Linux machine has. A kind named there must
open: asking for a device the machine lacks is an error, not a skip.
"""

import os

import pytest

from .support import model_fixtures as mf
from .support.require import require


def _device_kinds():
    raw = os.environ.get("METALQWEN_TEST_DEVICES", "cpu")
    kinds = [kind.strip() for kind in raw.split(",") if kind.strip()]
    return kinds or ["cpu"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under --dist loadgroup (the README's test command) a file's tests run on one worker, so its
    module fixtures and build directories are made once; a file marked `spread` (long tests that
    share nothing but session fixtures) lets xdist hand each test to whichever worker is free."""
    for item in items:
        if item.get_closest_marker("spread") is None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(scope="session", params=_device_kinds())
def device(request):
    from metalqwen import gpu

    yield gpu.Device(request.param)


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def converted(ckpt_root):
    """converted(name) -> (hf_path, mlx_path) of a model_fixtures.VARIANTS entry, built once per session."""
    require("mlx_lm")
    return lambda name: mf.checkpoint(name, ckpt_root)


@pytest.fixture(scope="session")
def demo(ckpt_root):
    from metalqwen.demo_checkpoint import write_demo_checkpoint

    return write_demo_checkpoint(os.path.join(ckpt_root, "demo"), seed=0)
