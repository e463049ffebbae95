"""The fiber context switch on every architecture we ship: x86_64 natively, and
aarch64 (Apple silicon's calling convention) under qemu when a cross compiler is present."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "tests" / "native" / "fiber_test.cpp", ROOT / "csrc" / "gpu" / "cpu" / "fiber.cpp"]


def _build_and_run(tmp_path, compiler, *runner, extra=()):
    exe = tmp_path / "fiber_test"
    subprocess.run([compiler, "-std=c++20", "-O2", *extra, "-I", str(ROOT / "csrc" / "gpu" / "cpu"),
                    *map(str, SOURCES), "-o", str(exe)], check=True)
    result = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "fiber_test: ok" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("variant", [(), ("-DMQ_FIBER_UCONTEXT=1",)], ids=["assembly", "ucontext"])
def test_native(tmp_path, variant):
    _build_and_run(tmp_path, "c++", extra=variant)


def test_aarch64_under_qemu(tmp_path):
    tools = ("aarch64-linux-gnu-g++", "qemu-aarch64")
    if not all(shutil.which(t) for t in tools):
        if os.environ.get("CI"):
            pytest.fail("aarch64 cross compiler or qemu missing: .ci/run installs g++-aarch64-linux-gnu qemu-user")
        pytest.skip("needs g++-aarch64-linux-gnu and qemu-user")
    _build_and_run(tmp_path, "aarch64-linux-gnu-g++", "qemu-aarch64", extra=("-static",))
