"""No silent waits: a first-run kernel compile announces itself, loads report both stages,
and long prefills show tokens done / total."""

from __future__ import annotations

import signal
import time

import metalqwen
from metalqwen import _core, gpu
from metalqwen.progress import ByteBar, LoadProgress, PrefillProgress, phase

_KERNEL = """
#include <metal_stdlib>
using namespace metal;
kernel void add_one(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] += 1.0f; }
"""


def test_a_first_compile_is_announced_and_a_cached_one_is_not(monkeypatch, tmp_path):
    monkeypatch.setenv("METALQWEN_CACHE_DIR", str(tmp_path / "cache"))
    device = gpu.Device("cpu")
    notice = device.compile_notice(_KERNEL, "add_one.metal")
    assert "compiling GPU kernels with" in notice and f"cached in {tmp_path / 'cache'}" in notice
    device.compile(_KERNEL, "add_one.metal")
    assert device.compile_notice(_KERNEL, "add_one.metal") == ""
    # A source that translates to a built object (here: one more newline) needs no compile.
    assert device.compile_notice(_KERNEL + "\n", "add_one.metal") == ""
    assert device.compile_notice(_KERNEL.replace("1.0f", "2.0f"), "add_one.metal") != ""


def test_the_engine_reports_weights_then_kernels(demo):
    metalqwen.load(demo, device="cpu", max_context=64, progress=False)  # the kernels are built and cached
    calls = []
    ckpt = metalqwen.load_checkpoint(demo)
    desc = ckpt.describe()
    _core.Engine(gpu.Device("cpu")._native, desc["dims"], desc["tensors"], 64, 8, 16,
                 progress=lambda *call: calls.append(call))
    weights = [c for c in calls if c[0] == "weights"]
    kernels = [c for c in calls if c[0] == "kernels"]
    assert calls.index(weights[-1]) < calls.index(kernels[0]), "weights first"
    assert weights[-1][1] == weights[-1][2] > 0
    assert [c[1] for c in kernels] == list(range(len(kernels))) and kernels[-1][1] == kernels[-1][2] > 10
    assert all(c[3] == "" for c in kernels), "a cached build is quick: no notice"


def test_load_progress_lines(capsys):
    shown = LoadProgress("cpu")
    shown("weights", 0, 2**30, "")
    shown("weights", 2**30, 2**30, "")
    shown("kernels", 0, 3, "compiling GPU kernels with g++ (first run only, cached in /c)")
    time.sleep(1.2)  # the ticker redraws the elapsed seconds
    shown("kernels", 3, 3, "compiling GPU kernels with g++ (first run only, cached in /c)")
    err = capsys.readouterr().err
    assert "loading onto cpu [" in err and "100% of 1.00 GiB" in err
    # Off a terminal the compile notice is said once, then when it is done (no ticking).
    assert err.count("compiling GPU kernels") == 2 and "): done in 1 s" in err, err


def test_on_a_terminal_the_compile_ticks(capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    shown = LoadProgress("cpu")
    shown("kernels", 0, 3, "compiling GPU kernels with g++ (first run only, cached in /c)")
    time.sleep(1.2)  # the ticker redraws the elapsed seconds
    shown("kernels", 3, 3, "compiling GPU kernels with g++ (first run only, cached in /c)")
    err = capsys.readouterr().err
    assert "first run only, cached in /c): 1 s" in err and "): done in 1 s" in err


def test_prefill_progress_shows_only_after_a_second(capsys):
    quick = PrefillProgress(after=1.0)
    quick(64, 128)
    quick(128, 128)
    quick.close()
    assert capsys.readouterr().err == ""
    slow = PrefillProgress(after=0.0)
    slow(64, 128)
    slow.close()  # an interrupted prefill ends its line
    slow = PrefillProgress(after=0.0)
    slow(128, 128)
    slow.close()
    err = capsys.readouterr().err
    assert "64/128 tokens" in err and "128/128 tokens" in err and err.endswith("\n") and not err.endswith("\n\n")


def test_a_ctrl_c_during_a_prefill_is_acknowledged_at_once(capfd, ctrl_c):
    bar = PrefillProgress(after=60.0)
    try:
        signal.raise_signal(signal.SIGINT)  # as if typed while the engine holds the main thread
    except KeyboardInterrupt:
        pass
    # Waited for on an event: reading the capture while the watcher writes could drop its line.
    assert bar._notice.acknowledged.wait(60), "no acknowledgement"
    assert "stopping after this chunk" in capfd.readouterr().err
    bar.close()
    assert signal.set_wakeup_fd(-1) == -1, "close() restores the previous wakeup fd"


def test_progress_off_a_terminal_is_a_few_plain_lines(capsys):
    bar = ByteBar("loading", 100)
    for done in range(101):  # a hundred redraws on a terminal
        bar.set(done)
    phase("mlx-lm: loading")
    err = capsys.readouterr().err
    assert "\r" not in err and "\033" not in err
    lines = err.splitlines()
    assert lines[0].startswith("metalqwen: loading [") and "100% of" in lines[-2] and len(lines) <= 4, lines
    assert lines[-1] == "mlx-lm: loading", "a phase names its engine, with no second prefix"
