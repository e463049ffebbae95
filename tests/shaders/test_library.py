"""The shader library as a whole: assembly, and that the installed copy is current."""

from metalqwen import _core

from .conftest import checkout_shader_files


def test_installed_shaders_match_the_checkout():
    assert _core.shader_library_source() == _core.shader_library_source(checkout_shader_files()), (
        "the installed extension embeds stale shaders: reinstall (pip install .)"
    )


def test_assembly_keeps_msl_line_numbers():
    source = _core.shader_library_source(checkout_shader_files())
    assert '#line 1 "shaders/params.h"' in source
    assert "#pragma once" not in source


def test_whole_library_compiles(shaders):
    shaders()
