"""Each model compiles only the kernels it runs: the engine's library holds the instances of its
plan (plus the plain kernels of their families' headers), reported in Model.counters()."""

from pathlib import Path

import pytest

import metalqwen
from metalqwen import _core


def test_a_model_compiles_only_its_kernels(demo):
    model = metalqwen.load(demo, device="cpu", max_context=64, progress=False)
    counters = model.counters()
    # The demo checkpoint: 4-bit g64 projections, q8 cache, bf16 vectors: one format's
    # instances of the families it runs, out of the 941 kernels of the whole library.
    assert 20 <= counters["library_kernels"] <= 120
    assert len(_core.kernel_names()) > 900
    assert 0 < counters["library_source_bytes"] < len(_core.shader_library_source())
    # A second model with the same kernels compiles the same library (cached: nothing new).
    again = metalqwen.load(demo, device="cpu", max_context=64, progress=False)
    assert again.counters()["library_kernels"] == counters["library_kernels"]
    assert again.counters()["library_source_bytes"] == counters["library_source_bytes"]


def test_metal_loads_the_prebuilt_library_where_the_package_has_one(demo, device):
    if device.kind != "metal":
        pytest.skip("the prebuilt library is Metal's (METALQWEN_TEST_DEVICES=metal,cpu on a Mac)")
    prebuilt = Path(_core.__file__).with_name("metalqwen.metallib").is_file()
    counters = metalqwen.load(demo, device=device, max_context=64, progress=False).counters()
    # The prebuilt library is the whole one (and compiles nothing at load); else the model's own.
    assert (counters["library_source_bytes"] == 0) == prebuilt
    assert (counters["library_kernels"] > len(_core.kernel_names())) == prebuilt
