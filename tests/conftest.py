"""Shared fixtures: the GPU devices the tests run on.

METALQWEN_TEST_DEVICES is a comma list of device kinds ("cpu", "metal"); it
defaults to "cpu", the runtime every Linux machine has. A kind named there must
open: asking for a device the machine lacks is an error, not a skip.
"""

import os
import sys

import pytest

# The tests share numpy helpers (reference.py) beside this file; make them
# importable whatever import mode pytest runs in.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)


def _device_kinds():
    raw = os.environ.get("METALQWEN_TEST_DEVICES", "cpu")
    kinds = [kind.strip() for kind in raw.split(",") if kind.strip()]
    return kinds or ["cpu"]


@pytest.fixture(scope="session", params=_device_kinds())
def device(request):
    from metalqwen import gpu

    yield gpu.Device(request.param)
