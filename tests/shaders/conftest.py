"""Fixtures for the shader-library tests: libraries assembled as the engine does,
from this checkout's shaders/ (so edits are tested without reinstalling)."""

from functools import lru_cache
from pathlib import Path

import pytest

from metalqwen import _core, gpu

SHADERS = Path(__file__).resolve().parents[2] / "shaders"


def checkout_shader_files() -> dict[str, str]:
    return {
        str(p.relative_to(SHADERS)): p.read_text() for p in sorted(SHADERS.rglob("*")) if p.suffix in (".metal", ".h")
    }


@lru_cache(maxsize=None)
def _compiled(device: gpu.Device, names: tuple[str, ...]):
    files = checkout_shader_files()
    if names:
        files = {path: text for path, text in files.items() if path.endswith(".h") or path in names}
        missing = set(names) - set(files)
        assert not missing, f"no such shader files: {sorted(missing)}"
    return device.compile(_core.shader_library_source(files), "metalqwen-shaders")


@pytest.fixture(scope="session")
def shaders(device):
    """shaders("quant.metal", ...) -> gpu.Library of those files (all files when none are named),
    compiled once per session on each device of METALQWEN_TEST_DEVICES (tests/conftest.py)."""
    return lambda *names: _compiled(device, tuple(sorted(names)))


@pytest.fixture(scope="session")
def dev(device):
    return device
