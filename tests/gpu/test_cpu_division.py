"""Integer division by zero (and INT_MIN / -1) in a kernel gives a value, as on a GPU,
instead of killing the process: x / 0 = 0, x % 0 = x, INT_MIN / -1 = INT_MIN,
INT_MIN % -1 = 0 (what aarch64 computes; on x86_64 a SIGFPE handler completes the
faulting instruction). A fault outside kernels still reaches the previous handler."""

import os
import platform
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from metalqwen import gpu

DIVIDE_SRC = """#include <metal_stdlib>
using namespace metal;
// Operands come from buffers so the compiler cannot fold them; every quotient and
// remainder is computed on its own: out [n][4] = (a / b unsigned, a % b unsigned, a / b, a % b).
template <class S, class U>
void divide(device const S* a, device const S* b, device S* out, uint i) {
    out[4 * i + 0] = S(U(a[i]) / U(b[i]));
    out[4 * i + 1] = S(U(a[i]) % U(b[i]));
    out[4 * i + 2] = a[i] / b[i];
    out[4 * i + 3] = a[i] % b[i];
}
kernel void divide32(device const int* a [[buffer(0)]], device const int* b [[buffer(1)]],
                     device int* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    divide<int, uint>(a, b, out, i);
}
kernel void divide64(device const long* a [[buffer(0)]], device const long* b [[buffer(1)]],
                     device long* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    divide<long, ulong>(a, b, out, i);
}
kernel void divide16(device const short* a [[buffer(0)]], device const short* b [[buffer(1)]],
                     device short* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    divide<short, ushort>(a, b, out, i);
}
kernel void divide8(device const char* a [[buffer(0)]], device const char* b [[buffer(1)]],
                    device char* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    divide<char, uchar>(a, b, out, i);
}
"""

KERNELS = {np.int32: "divide32", np.int64: "divide64", np.int16: "divide16", np.int8: "divide8"}


def expected(a, b, dtype):
    """(a/b, a%b) unsigned, then signed, with the GPU's answers for /0 and MIN/-1."""
    udtype = np.dtype(dtype).str.replace("i", "u")
    rows = []
    for x, y in zip(a.tolist(), b.tolist()):
        ux, uy = np.array(x, dtype).view(udtype).item(), np.array(y, dtype).view(udtype).item()
        uq, ur = (0, ux) if uy == 0 else (ux // uy, ux % uy)
        if y == 0:
            q, r = 0, x
        else:
            q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)  # C truncates toward zero
            r = x - q * y
        rows.append([np.array(uq, udtype).view(dtype), np.array(ur, udtype).view(dtype),
                     np.array(q).astype(dtype), np.array(r).astype(dtype)])  # MIN / -1 wraps to MIN
    return np.array(rows, dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16, np.int8], ids=["32", "64", "16", "8"])
def test_division_by_zero_and_overflow_give_values(dtype):
    dev = gpu.Device("cpu")
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    # Ordinary divisions around the faulting ones check that execution resumes correctly.
    a = np.array([7, 7, -7, lo, lo, hi, 0, -1, 100, lo, 13, -13], dtype)
    b = np.array([0, 2, 0, -1, 0, 0, 0, 0, -7, 1, 5, -1], dtype)
    out = dev.empty(a.nbytes * 4)
    lib = dev.compile(DIVIDE_SRC, "divide.metal")
    lib.kernel(KERNELS[dtype]).dispatch({0: dev.buffer(a), 1: dev.buffer(b), 2: out}, threadgroups=(1,),
                                        threads=(len(a),))
    np.testing.assert_array_equal(out.numpy(dtype, (len(a), 4)), expected(a, b, dtype))


CHAIN_SCRIPT = textwrap.dedent("""
    import ctypes, os, signal
    import numpy as np
    from metalqwen import gpu

    caught = []
    signal.signal(signal.SIGFPE, lambda *_: caught.append(True))
    dev = gpu.Device("cpu")
    out = dev.empty(16)
    lib = dev.compile(SOURCE, "divide.metal")
    lib.kernel("divide32").dispatch({0: dev.buffer(np.array([5], np.int32)), 1: dev.buffer(np.array([0], np.int32)),
                                     2: out}, threadgroups=(1,), threads=(1,))
    print("kernel:", out.numpy(np.int32).tolist(), flush=True)
    os.kill(os.getpid(), signal.SIGFPE)  # not a division: the Python handler installed first gets it
    print("python handler:", caught, flush=True)
    signal.signal(signal.SIGFPE, signal.SIG_DFL)
    dev.compile(SOURCE, "divide.metal").kernel("divide32").dispatch(
        {0: dev.buffer(np.array([1], np.int32)), 1: dev.buffer(np.array([1], np.int32)), 2: out},
        threadgroups=(1,), threads=(1,))  # reinstalls ours over SIG_DFL
    ctypes.CDLL(None).div(1, 0)  # a division by zero outside any kernel: the default action
    print("survived", flush=True)
""")


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="needs a CPU whose division by zero faults (x86_64) and glibc's div()")
def test_faults_outside_kernels_reach_the_previous_handler():
    python_dir = Path(gpu.__file__).resolve().parents[1]
    script = f"SOURCE = {DIVIDE_SRC!r}\n" + CHAIN_SCRIPT
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(python_dir)})
    assert "kernel: [0, 5, 0, 5]" in proc.stdout, proc.stderr
    assert "python handler: [True]" in proc.stdout
    assert "survived" not in proc.stdout
    assert proc.returncode == -signal.SIGFPE, (proc.returncode, proc.stderr)


def test_divisions_by_zero_on_every_worker_at_once():
    dev = gpu.Device("cpu")
    groups, threads = 64, 32
    a = np.arange(groups * threads, dtype=np.int32) - 1000
    b = np.where(np.arange(a.size) % 3 == 0, 0, 7).astype(np.int32)
    out = dev.empty(a.nbytes * 4)
    dev.compile(DIVIDE_SRC, "divide.metal").kernel("divide32").dispatch(
        {0: dev.buffer(a), 1: dev.buffer(b), 2: out}, threadgroups=(groups,), threads=(threads,))
    np.testing.assert_array_equal(out.numpy(np.int32, (a.size, 4)), expected(a, b, np.int32))
