"""The fiber context switch on every architecture we ship: x86_64 natively (g++ and clang),
aarch64 (Apple silicon's calling convention) under qemu, and assembled for arm64-apple-macos
by clang, the only compiler a Mac has."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "tests" / "gpu" / "native" / "fiber_test.cpp", ROOT / "csrc" / "gpu" / "cpu" / "fiber.cpp"]


def _build_and_run(tmp_path, compiler, *runner, extra=()):
    exe = tmp_path / "fiber_test"
    subprocess.run([compiler, "-std=c++20", "-O2", *extra, "-I", str(ROOT / "csrc" / "gpu" / "cpu"),
                    *map(str, SOURCES), "-o", str(exe)], check=True)
    result = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "fiber_test: ok" in result.stdout, result.stdout + result.stderr


def _require(*tools):
    if not all(shutil.which(t) for t in tools):
        if os.environ.get("CI"):
            pytest.fail(f"{' and '.join(tools)} missing: .ci/run installs them")
        pytest.skip(f"needs {' and '.join(tools)}")


@pytest.mark.parametrize("compiler", ["c++", "clang++"])
@pytest.mark.parametrize("variant", [(), ("-DMQ_FIBER_UCONTEXT=1",)], ids=["assembly", "ucontext"])
def test_native(tmp_path, compiler, variant):
    _require(compiler)
    _build_and_run(tmp_path, compiler, extra=variant)


@pytest.mark.parametrize("target", ["arm64-apple-macos14", "x86_64-apple-macos14"])
def test_switch_assembles_for_macos(tmp_path, target):
    """The Mach-O spelling (leading underscore, no .type) of both entry points, as a Mac's clang builds it."""
    _require("clang++", "llvm-nm")
    obj = tmp_path / "fiber_switch.o"
    subprocess.run(["clang++", "-target", target, "-ffreestanding", "-nostdinc++", "-std=c++20", "-Werror", "-x", "c++",
                    "-c", "-", "-I", str(ROOT / "csrc" / "gpu" / "cpu"), "-o", str(obj)],
                   input='#include "fiber_switch.h"\n', text=True, check=True)
    symbols = subprocess.run(["llvm-nm", str(obj)], capture_output=True, text=True, check=True).stdout.split()
    for name in ("_mq_fiber_switch_asm", "_mq_fiber_start_asm"):
        assert name in symbols and symbols[symbols.index(name) - 1] == "T", symbols


def test_aarch64_under_qemu(tmp_path):
    _require("aarch64-linux-gnu-g++", "qemu-aarch64")
    _build_and_run(tmp_path, "aarch64-linux-gnu-g++", "qemu-aarch64", extra=("-static",))
