"""metalqwen_bench (bench/, -DMETALQWEN_BENCH=ON) builds and runs with --quick at the tiny shape
on each test device, and reports every field. On the CPU runtime its figures time a test
backend, and the output must say so; nothing about speed is asserted anywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Kept between runs (build/ is ignored by git): later runs only rebuild what changed.
BUILD = ROOT / "build" / "metalqwen-bench-test"

# Every kernel a greedy one-row decode step of a dense model encodes (forward.cpp).
# Matvec variants as the engine picks them at the tiny shape for 10 cores (the CPU runtime's): R = 8 for
# the norm-fused groups (1024+ rows), 4 for out_proj (with the gated norm's factor) / o_proj / down (512 rows).
DECODE_KERNELS = {"embed_b4_g64", "qmv_norm_r8_b4_g64", "qmv_r4_b4_g64", "qmv_norm_silu_r8_b4_g64",
                  "delta_conv_scan_alog_f32", "qmv_head_norm_r4_b4_g64", "attn_decode_q8_r1", "argmax_partial",
                  "argmax_final"}


@pytest.fixture(scope="module")
def bench_exe() -> Path:
    if shutil.which("cmake") is None:
        if os.environ.get("CI"):
            pytest.fail("cmake is missing: the build needs it")
        pytest.skip("needs cmake")
    import pybind11

    # -O0 and no build type: these tests check fields and structure, never speed, and the
    # unoptimized build costs about half the compiler time of Release (bench/README keeps Release).
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=", "-DCMAKE_CXX_FLAGS=-O0",
                    "-DMETALQWEN_BENCH=ON", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                    f"-DPython_EXECUTABLE={sys.executable}"],
                   check=True, capture_output=True, timeout=300)
    built = subprocess.run(["cmake", "--build", str(BUILD), "--target", "metalqwen_bench", "-j2"],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return BUILD / "metalqwen_bench"


def _run(exe: Path, device, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([str(exe), "--device", device.kind, "--shape", "tiny", "--quick", *args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def test_json_has_every_kernel_of_a_decode_step_and_the_step(bench_exe, device):
    report = json.loads(_run(bench_exe, device, "--json").stdout)
    assert report["device"]["kind"] == device.kind and report["device"]["name"] == device.name
    if device.kind == "cpu":  # no peak bandwidth is known for the CPU runtime
        assert report["device"]["chip"] is None and report["device"]["peak_gb_s"] is None
        assert "say nothing about an Apple GPU" in report["note"]
    assert report["quick"] is True
    (shape,) = report["shapes"]
    assert shape["shape"] == "tiny" and shape["error"] is None and shape["context"] == 1
    assert {k["kernel"] for k in shape["kernels"]} == DECODE_KERNELS
    for k in shape["kernels"]:
        assert k["per_step"] >= 1 and k["us_per_dispatch"] > 0 and k["sizes"], k
        assert k["bytes"] > 0 and k["flops"] >= 0 and k["gb_s"] > 0 and k["gflop_s"] >= 0, k
        assert (k["peak_pct"] is None) == (report["device"]["peak_gb_s"] is None), k
    step = shape["decode_step"]
    # The per-kernel rows cover the whole step.
    assert sum(k["per_step"] for k in shape["kernels"]) == step["dispatches"]
    assert 0 < step["barriers"] < step["dispatches"]
    assert step["us_per_token"] > 0 and step["tokens_per_s"] > 0 and step["host_encode_us"] > 0
    # The step moves at least its weights (plus the recurrent state, cache and activations).
    assert step["bytes_per_token"] >= step["weight_bytes_per_token"] > 0
    assert (step["share_of_limit"] is None) == (report["device"]["peak_gb_s"] is None)
    assert (step["limit_us_per_token"] is None) == (step["share_of_limit"] is None)


def test_the_table_says_what_the_figures_mean_and_gives_the_limit_with_a_peak(bench_exe, device):
    out = _run(bench_exe, device, "--peak-gbs", "100", "--filter", "qmv|decode_step").stdout
    assert ("say nothing about an Apple GPU" in out) == (device.kind == "cpu") and "--quick" in out
    assert "qmv_r4_b4_g64" in out and "delta_scan_norm" not in out, "the filter keeps only what it matches"
    assert "decode step at context 1:" in out and "% of it" in out and "at 100 GB/s" in out


def test_bad_options_exit_2_with_the_usage(bench_exe):
    for args in (["--shape", "70B"], ["--repeats", "0"], ["--device", "tpu"], ["--filter", "("]):
        out = subprocess.run([str(bench_exe), *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "usage: metalqwen_bench" in out.stderr, args
