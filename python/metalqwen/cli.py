"""The `metalqwen` command."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import gpu

_SMOKE_KERNEL = """
#include <metal_stdlib>
using namespace metal;

// out[i] = sum of x over i's SIMD-group, scaled: exercises dispatch, bindings and a collective.
kernel void smoke_simd_sum(device const float* x [[buffer(0)]],
                           device float* out [[buffer(1)]],
                           constant float& scale [[buffer(2)]],
                           uint i [[thread_position_in_grid]])
{
    out[i] = simd_sum(x[i]) * scale;
}
"""


def _devices(args: argparse.Namespace) -> int:
    """Runs a small kernel on every available device and checks the result."""
    x = np.arange(256, dtype=np.float32)
    want = np.repeat(x.reshape(-1, 32).sum(axis=1), 32) * 0.5
    failed = 0
    for kind in gpu.available_kinds():
        start = time.perf_counter()
        dev = gpu.Device(kind)
        kernel = dev.compile(_SMOKE_KERNEL, "smoke.metal").kernel("smoke_simd_sum")
        out = dev.empty(x.nbytes)
        kernel.dispatch({0: dev.buffer(x), 1: out, 2: np.float32(0.5)}, threadgroups=(2,), threads=(128,))
        ok = np.array_equal(out.numpy(np.float32), want)
        failed += not ok
        print(f"{kind:6s} {dev.name}: {'ok' if ok else 'WRONG RESULT'} ({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metalqwen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    devices = commands.add_parser("devices", help="list the GPU devices and run a smoke kernel on each")
    devices.set_defaults(run=_devices)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except gpu.GpuError as e:
        print(f"metalqwen: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
