"""The prebuilt Metal library's source (cmake/metal.cmake, on a Mac with Xcode): every .metal file
in one translation unit plus the key kernel by which the engine knows it matches its embedded
shaders. Apple's compiler cannot run here; the MSL check judges the same unit."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from metalqwen import _core, gpu

ROOT = Path(__file__).resolve().parents[2]


def metallib_source(tmp_path) -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("needs cmake (a build requirement: pip install cmake)")
    shaders = sorted(str(p) for p in (ROOT / "shaders").rglob("*") if p.suffix in (".metal", ".h"))
    out = tmp_path / "metalqwen_library.metal"
    subprocess.run([cmake, f"-DOUT={out}", f"-DROOT={ROOT / 'shaders'}", f"-DFILES={';'.join(shaders)}",
                    "-P", str(ROOT / "tools" / "metallib_source.cmake")], check=True)
    return out.read_text()


def test_the_metallib_holds_the_embedded_shaders_key(tmp_path):
    source = metallib_source(tmp_path)
    assert re.findall(r"mq_library_([0-9a-f]{32})\(", source) == [_core.shader_library_key()]
    # Every .metal file once, whatever their number (a new family adds a file).
    metal_files = sorted(str(p) for p in (ROOT / "shaders").rglob("*.metal"))
    assert re.findall(r'^#include "(.*\.metal)"$', source, re.M) == metal_files


def test_the_metallib_unit_passes_the_msl_check(tmp_path):
    # One translation unit of every .metal file: each header once (#pragma once), no clash.
    gpu.check_msl(metallib_source(tmp_path), "metalqwen_library.metal")
