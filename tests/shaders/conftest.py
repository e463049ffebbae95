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
def _compiled(device: gpu.Device, name: str) -> gpu.Library:
    """One .metal file (its header and its instances) compiled once per session: a file's kernels
    are compiled once per run whichever tests use them (the CPU runtime's cache is shared across
    processes, its builds under a file lock)."""
    files = checkout_shader_files()
    assert name in files, f"no such shader file: {name}"
    files = {path: text for path, text in files.items() if not path.endswith(".metal") or path == name}
    return device.compile(_core.shader_library_source(files), "metalqwen-shaders")


class Kernels:
    """The kernels of several shader files, each file's library compiled once per session."""

    def __init__(self, libraries: list[gpu.Library]):
        self._owner = {name: lib for lib in libraries for name in lib.kernel_names()}

    def kernel(self, name: str) -> gpu.Kernel:
        if name not in self._owner:
            raise gpu.GpuError(f"no kernel function '{name}' in the files asked for")
        return self._owner[name].kernel(name)

    def kernel_names(self) -> list[str]:
        return sorted(self._owner)


def compiled_kernels(device: gpu.Device, *names: str) -> Kernels:
    """The kernels of the files `names` (all files when none are named) on `device`."""
    names = names or tuple(p for p in checkout_shader_files() if p.endswith(".metal"))
    return Kernels([_compiled(device, name) for name in sorted(names)])


@pytest.fixture(scope="session")
def shaders(device):
    """shaders("quant.metal", ...) -> the kernels of those files (all files when none are named),
    on each device of METALQWEN_TEST_DEVICES (tests/conftest.py)."""
    return lambda *names: compiled_kernels(device, *names)


@pytest.fixture(scope="session")
def dev(device):
    return device
