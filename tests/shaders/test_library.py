"""The shader library as a whole: assembly, every kernel host name, the library of a kernel
subset (what a model compiles), and that the installed copy is current."""

from pathlib import Path

import pytest

from metalqwen import _core
from metalqwen.errors import EngineError

from .conftest import checkout_shader_files

# Every host name the library had before its instantiations became macro tables (one per line).
KERNEL_NAMES = (Path(__file__).parent / "kernel_names.txt").read_text().split()


def test_installed_shaders_match_the_checkout():
    assert _core.shader_library_source() == _core.shader_library_source(checkout_shader_files()), (
        "the installed extension embeds stale shaders: reinstall (pip install .)"
    )


def test_assembly_keeps_msl_line_numbers():
    source = _core.shader_library_source(checkout_shader_files())
    assert '#line 1 "shaders/params.h"' in source
    assert "#pragma once" not in source


def test_metal_files_hold_instances_only():
    # Bodies live in headers; a .metal file includes its own header, never another .metal file.
    for path, text in checkout_shader_files().items():
        if path.endswith(".metal"):
            assert f'#include "{path[:-6]}.h"' in text
            assert '.metal"' not in text and "{" not in text, path


def test_the_tables_name_every_kernel_there_was():
    assert sorted(_core.kernel_names()) == sorted(KERNEL_NAMES)
    assert len(set(_core.kernel_names())) == len(KERNEL_NAMES)


def test_every_kernel_there_was_compiles_under_its_host_name(shaders):
    assert shaders().kernel_names() == sorted(KERNEL_NAMES)


def test_weight_formats_are_the_tables_suffixes():
    formats = _core.weight_formats()
    assert len(formats) == len(set(formats)) == 30
    assert {"b4_g64", "b8_g32", "b2_g128", "b4_g64_sf32", "mxfp4", "nvfp4", "mxfp8", "bf16", "f16", "f32"} <= set(formats)
    assert all(f"qmv_r4_{f}" in KERNEL_NAMES and f"embed_{f}" in KERNEL_NAMES for f in formats)


def test_a_kernel_subset_compiles_only_those_instances(dev):
    # What the engine compiles for a model: the families' headers (their plain kernels
    # included) and only the instances asked for.
    source = _core.shader_library_source(checkout_shader_files(), kernels={"qmv_r4_b4_g64", "rms_norm_wf32"})
    assert len(source) < len(_core.shader_library_source(checkout_shader_files())) // 2
    lib = dev.compile(source, "metalqwen-shaders")
    assert sorted(lib.kernel_names()) == ["qmv_r4_b4_g64", "residual_add", "rms_norm_wf32", "silu_mul"]


def test_a_kernel_subset_refuses_unknown_names():
    with pytest.raises(EngineError, match="no kernel named 'qmv_r3_b4_g64'"):
        _core.shader_library_source(kernels={"qmv_r3_b4_g64"})
