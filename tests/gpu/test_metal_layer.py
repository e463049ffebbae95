"""The Metal layer cannot run here: type-check it against Apple's API on Linux.

run.sh checks csrc/gpu/metal/*.mm with clang (-fsyntax-only -x objective-c++ -fobjc-arc)
against the stub headers and proves the check catches typical API mistakes;
check_api_names.py proves every stub declaration is real SDK API (PyObjC's metadata)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "tools" / "metal_check"


def _require_clang():
    if shutil.which(os.environ.get("CLANGXX", "clang++")) is None:
        if os.environ.get("CI"):
            pytest.fail("clang++ is missing: .ci/run must install it (apt-get install clang)")
        pytest.skip("clang++ is not installed (apt-get install clang)")


def _run(*command):
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_metal_sources_type_check_against_the_api_stubs():
    _require_clang()
    out = _run("bash", str(CHECK / "run.sh"))
    assert "metal_check: ok csrc/gpu/metal/metal_device.mm" in out


def test_api_stubs_name_only_real_sdk_api():
    _require_clang()
    _run(sys.executable, str(CHECK / "check_api_names.py"), "--self-test")


def test_the_metal_open_probe_kernel_is_valid_msl(device):
    """open_metal_device compiles this kernel (bfloat: MSL 3.1; simd_sum) to learn the SIMD width:
    it must compile and compute, or every Mac would refuse to open."""
    import re

    import numpy as np

    rules = (ROOT / "csrc" / "gpu" / "metal" / "metal_rules.h").read_text()
    source = re.search(r'kProbeKernelSource = R"\((.*?)\)";', rules, re.S).group(1)
    name = re.search(r'kProbeKernelName = "(\w+)";', rules).group(1)
    kernel = device.compile(source, "metalqwen_probe.metal").kernel(name)
    assert kernel.thread_execution_width == 32
    out = device.empty(64 * 2)
    kernel.dispatch({0: out}, threadgroups=(1,), threads=(64,))
    values = (out.numpy(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(values, np.repeat([sum(range(32)), sum(range(32, 64))], 32).astype(np.float32))
