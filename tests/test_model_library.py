"""Each model compiles only the kernels it runs: the engine's library holds the instances of its
plan (plus the plain kernels of their families' headers), reported in Model.counters()."""

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
