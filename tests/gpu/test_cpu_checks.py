"""The CPU runtime's checking mode: Device("cpu", checks=("races", "bounds")).

Each class of bug has a tiny kernel that must be reported (naming the kernel, the buffer or
threadgroup variable, both threads and both MSL lines) and a correct twin that must run clean.
"""

import re

import numpy as np
import pytest

from metalqwen import _core, gpu

HEADER = """
#include <metal_stdlib>
using namespace metal;
"""


@pytest.fixture(scope="module")
def checked():
    return gpu.Device("cpu", checks=("races", "bounds"))


def compile_kernels(device, body, name="checks.metal"):
    return device.compile(HEADER + body, name)


def line_of(body, needle):
    """The MSL line of `needle` in HEADER + body, as reports name it."""
    for number, text in enumerate((HEADER + body).splitlines(), 1):
        if needle in text:
            return number
    raise AssertionError(needle)


def run(device, body, kernel, args, groups=1, threads=64):
    lib = compile_kernels(device, body)
    lib.kernel(kernel).dispatch(args, groups, threads)


def report(device, body, kernel, args, groups=1, threads=64):
    with pytest.raises(gpu.GpuError) as info:
        run(device, body, kernel, args, groups, threads)
    return str(info.value)


BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"

# --- threadgroup memory -----------------------------------------------------------------

BROADCAST = """
kernel void broadcast(device float* out [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
    threadgroup float shared_value;
    if (i == 0) shared_value = 3.0f;   // WRITE
    BARRIER
    out[i] = shared_value;             // READ
}
"""


def test_broadcast_without_barrier_is_a_race(checked):
    body = BROADCAST.replace("BARRIER", "")
    text = report(checked, body, "broadcast", {0: checked.empty(256)})
    assert "kernel 'broadcast'" in text and "data race" in text
    assert "threadgroup variable 'shared_value'" in text
    assert "thread 0" in text
    assert f"checks.metal:{line_of(body, '// WRITE')}" in text
    assert f"checks.metal:{line_of(body, '// READ')}" in text


def test_broadcast_with_barrier_is_clean(checked):
    out = checked.empty(256)
    run(checked, BROADCAST.replace("BARRIER", BARRIER), "broadcast", {0: out})
    np.testing.assert_array_equal(out.numpy(np.float32), np.full(64, 3.0, np.float32))


NEIGHBOUR = """
kernel void neighbour(device float* out [[buffer(0)]], uint i [[thread_index_in_threadgroup]],
                      uint n [[threads_per_threadgroup]]) {
    threadgroup float values[64];
    values[i] = float(i);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float right = values[(i + 1) % n];   // READ
    BARRIER
    values[i] = right;                          // WRITE
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = values[i];
}
"""


def test_write_after_read_without_barrier_is_a_race(checked):
    body = NEIGHBOUR.replace("BARRIER", "")
    text = report(checked, body, "neighbour", {0: checked.empty(256)})
    assert re.search(r"data race \((write after read|read after write)\) on byte \d+ of threadgroup variable 'values'",
                     text)
    assert f"checks.metal:{line_of(body, '// READ')}" in text and f"checks.metal:{line_of(body, '// WRITE')}" in text


def test_write_after_read_with_barrier_is_clean(checked):
    out = checked.empty(256)
    run(checked, NEIGHBOUR.replace("BARRIER", BARRIER), "neighbour", {0: out})
    np.testing.assert_array_equal(out.numpy(np.float32), (np.arange(64) + 1) % 64)


def test_write_after_write_is_a_race(checked):
    body = """
kernel void last_wins(device float* out [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
    threadgroup float winner;
    winner = float(i);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = winner;
}
"""
    text = report(checked, body, "last_wins", {0: checked.empty(256)})
    assert "data race (write after write) on byte 0 of threadgroup variable 'winner'" in text


SIMD_ORDERED = """
kernel void lane_zero_writes(device float* out [[buffer(0)]], uint i [[thread_index_in_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    threadgroup float per_simdgroup[2];
    if (lane == 0) per_simdgroup[sg] = float(sg + 1);
    SYNC
    out[i] = per_simdgroup[READ_FROM];
}
"""


@pytest.mark.parametrize("sync", ["simdgroup_barrier(mem_flags::mem_threadgroup);", "(void)simd_sum(1.0f);"])
def test_simdgroup_sync_orders_the_lanes_of_one_simdgroup(checked, sync):
    out = checked.empty(256)
    run(checked, SIMD_ORDERED.replace("SYNC", sync).replace("READ_FROM", "sg"), "lane_zero_writes", {0: out})
    np.testing.assert_array_equal(out.numpy(np.float32), np.repeat([1.0, 2.0], 32))


def test_simdgroup_barrier_does_not_order_other_simdgroups(checked):
    body = SIMD_ORDERED.replace("SYNC", "simdgroup_barrier(mem_flags::mem_threadgroup);").replace("READ_FROM", "1 - sg")
    text = report(checked, body, "lane_zero_writes", {0: checked.empty(256)})
    assert "threadgroup variable 'per_simdgroup'" in text
    assert "other SIMD-groups are not ordered by simdgroup_barrier" in text


def test_threadgroup_array_overrun_is_out_of_bounds(checked):
    body = """
kernel void overrun(device float* out [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
    threadgroup float small[32];
    small[i] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = small[i];
}
"""
    text = report(checked, body, "overrun", {0: checked.empty(256)})
    assert re.search(r"out-of-bounds write of 4 bytes at byte \d+ of threadgroup variable 'small' \(128 bytes\)", text)


# --- device memory ----------------------------------------------------------------------

WRITE_ONE = """
kernel void write_one(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[INDEX] = float(i);
}
kernel void read_one(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
    out[i] = in[i];
}
"""


def test_two_threads_writing_one_device_word_race(checked):
    text = report(checked, WRITE_ONE.replace("INDEX", "i / 2"), "write_one", {0: checked.empty(256)})
    assert re.search(r"data race \(write after write\) on byte \d+ of buffer\(0\) 'out'", text)


def test_threads_of_different_threadgroups_race(checked):
    body = WRITE_ONE.replace("INDEX", "i % 32")
    text = report(checked, body, "write_one", {0: checked.empty(256)}, groups=2, threads=32)
    assert re.search(r"by thread \d+ of threadgroup \([01], 0, 0\)", text)
    assert "threadgroups of a dispatch are not ordered" in text


def test_disjoint_device_writes_are_clean(checked):
    out = checked.empty(256)
    run(checked, WRITE_ONE.replace("INDEX", "i"), "write_one", {0: out}, groups=2, threads=32)
    np.testing.assert_array_equal(out.numpy(np.float32), np.arange(64))


def test_device_writes_ordered_by_a_threadgroup_barrier_are_clean(checked):
    body = """
kernel void publish(device float* data [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
    if (i == 0) data[0] = 5.0f;
    threadgroup_barrier(mem_flags::mem_device);
    data[i + 1] = data[0];
}
"""
    data = checked.empty(65 * 4)
    run(checked, body, "publish", {0: data})
    np.testing.assert_array_equal(data.numpy(np.float32), np.full(65, 5.0))


@pytest.mark.parametrize("with_barrier", [False, True])
def test_dispatches_without_a_barrier_between_them_race(checked, with_barrier):
    lib = compile_kernels(checked, WRITE_ONE.replace("INDEX", "i"))
    a, b = checked.empty(256), checked.empty(256)
    cb = checked.command_buffer()
    cb.dispatch(lib.kernel("write_one"), {0: a}, 1, 64)
    if with_barrier:
        cb.barrier()
    cb.dispatch(lib.kernel("read_one"), {0: a, 1: b}, 1, 64)
    cb.commit()
    if with_barrier:
        cb.wait()
        np.testing.assert_array_equal(b.numpy(np.float32), np.arange(64))
        return
    with pytest.raises(gpu.GpuError, match="dispatches with no barrier between them may run in any order") as info:
        cb.wait()
    assert "kernel 'write_one'" in str(info.value) and "kernel 'read_one'" in str(info.value)


def test_atomics_are_not_races(checked):
    body = """
kernel void count(device atomic_uint* total [[buffer(0)]], device uint* out [[buffer(1)]],
                  uint i [[thread_index_in_threadgroup]]) {
    threadgroup atomic_uint local;
    if (i == 0) atomic_store_explicit(&local, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(&local, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(total, 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (i == 0) out[0] = atomic_load_explicit(&local, memory_order_relaxed);
}
"""
    total, out = checked.buffer(np.zeros(1, np.uint32)), checked.empty(4)
    lib = compile_kernels(checked, body)
    lib.kernel("count").dispatch({0: total, 1: (out, 0)}, 1, 64)
    assert total.numpy(np.uint32)[0] == 64 and out.numpy(np.uint32)[0] == 64
    cb = checked.command_buffer()  # groups and dispatches may add to one counter concurrently
    cb.dispatch(lib.kernel("count"), {0: total, 1: out}, 3, 64)
    cb.dispatch(lib.kernel("count"), {0: total, 1: checked.empty(4)}, 1, 64)
    cb.commit()
    with pytest.raises(gpu.GpuError, match="write after write\\) on byte 0 of buffer\\(1\\) 'out'"):
        cb.wait()  # ... but the plain write of `out` by three groups is a race


OFF_BY_ONE = """
kernel void shift(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
    out[i] = in[i + 1];   // READ
}
kernel void widen(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
    out[i + 1] = in[i];   // WRITE
}
kernel void from_bytes(constant float* table [[buffer(0)]], device float* out [[buffer(1)]],
                       uint i [[thread_position_in_grid]]) {
    out[i] = table[i];
}
"""


def test_out_of_bounds_read_names_kernel_buffer_offset_and_line(checked):
    text = report(checked, OFF_BY_ONE, "shift", {0: checked.empty(256), 1: checked.empty(256)})
    assert "kernel 'shift'" in text and "thread 63" in text
    assert "out-of-bounds read of 4 bytes at byte 256 of buffer(0) 'in', which has 256 bytes bound" in text
    assert f"checks.metal:{line_of(OFF_BY_ONE, '// READ')}" in text


def test_out_of_bounds_write_counts_from_the_binding_offset(checked):
    big = checked.empty(1024)
    text = report(checked, OFF_BY_ONE, "widen", {0: checked.empty(256), 1: (big, 768)})
    assert "out-of-bounds write of 4 bytes at byte 256 of buffer(1) 'out', which has 256 bytes bound" in text
    out = checked.empty(260)
    run(checked, OFF_BY_ONE, "widen", {0: checked.buffer(np.arange(64, dtype=np.float32)), 1: out})
    np.testing.assert_array_equal(out.numpy(np.float32)[1:], np.arange(64))


def test_out_of_bounds_set_bytes_read(checked):
    table = np.arange(16, dtype=np.float32)
    text = report(checked, OFF_BY_ONE, "from_bytes", {0: table, 1: checked.empty(256)})
    assert re.search(r"out-of-bounds read of 4 bytes at byte \d+ of buffer\(0\) 'table', which has 64 bytes bound", text)
    out = checked.empty(64)
    run(checked, OFF_BY_ONE, "from_bytes", {0: table, 1: out}, threads=16)
    np.testing.assert_array_equal(out.numpy(np.float32), table)


def two_blocks(device):
    return {0: device.empty(4 * 128), 1: device.empty(4 * 128)}  # four 128-byte Blocks each


def test_block_copies_are_checked(checked):
    """Copy and fill loops compile to memcpy/memset (g++: __tsan_read_range/__tsan_write_range
    around them; clang: __tsan_memcpy/__tsan_memset): they must be checked too."""
    body = """
struct Block { float v[32]; };
kernel void copy_blocks(device const Block* in [[buffer(0)]], device Block* out [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
    for (int k = 0; k < 32; k++) out[i].v[k] = in[i + SHIFT].v[k];  // a memcpy after optimisation
    if (i == ZEROER)
        for (int k = 0; k < 32; k++) out[0].v[k] = 0.0f;  // a memset
}
"""
    text = report(checked, body.replace("SHIFT", "1").replace("ZEROER", "0"), "copy_blocks", two_blocks(checked), threads=4)
    assert re.search(r"out-of-bounds read of \d+ bytes at byte 512 of buffer\(0\) 'in'", text)
    text = report(checked, body.replace("SHIFT", "0").replace("ZEROER", "1"), "copy_blocks", two_blocks(checked), threads=4)
    assert "data race (write after write) on byte 0 of buffer(1) 'out'" in text


def test_constant_tables_and_threadgroup_arguments_are_in_bounds(checked):
    """Program-scope constants live in the kernel's library, [[threadgroup(n)]] arguments in
    threadgroup memory: reading them is fine; past a threadgroup argument's length is not."""
    body = """
constant float table[4] = {1.0f, 2.0f, 3.0f, 4.0f};
kernel void lookup(device float* out [[buffer(0)]], threadgroup float* scratch [[threadgroup(0)]],
                   uint i [[thread_index_in_threadgroup]]) {
    scratch[i] = table[i % 4];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = scratch[(i + 1) % LENGTH];
}
"""
    lib = compile_kernels(checked, body.replace("LENGTH", "64"))
    out = checked.empty(256)
    cb = checked.command_buffer()
    cb._native.set_threadgroup_memory(0, 256)
    cb.dispatch(lib.kernel("lookup"), {0: out}, 1, 64)
    cb.commit()
    cb.wait()
    np.testing.assert_array_equal(out.numpy(np.float32), (np.arange(1, 65) % 4) + 1)
    cb = checked.command_buffer()
    cb._native.set_threadgroup_memory(0, 128)
    cb.dispatch(compile_kernels(checked, body.replace("LENGTH", "64")).kernel("lookup"), {0: out}, 1, 64)
    cb.commit()
    with pytest.raises(gpu.GpuError, match=r"out-of-bounds write of 4 bytes at byte \d+ of threadgroup variable "
                                           r"'\[\[threadgroup\(0\)\]\]' \(128 bytes\)"):
        cb.wait()


# --- selecting checks ---------------------------------------------------------------------


def test_each_check_is_separate():
    racy = BROADCAST.replace("BARRIER", "")
    bounds_only = gpu.Device("cpu", checks=("bounds",))
    run(bounds_only, racy, "broadcast", {0: bounds_only.empty(256)})
    races_only = gpu.Device("cpu", checks=("races",))
    run(races_only, OFF_BY_ONE, "shift", {0: races_only.empty(256), 1: races_only.empty(256)})  # reads 4 bytes past
    with pytest.raises(gpu.GpuError, match="data race"):
        run(races_only, racy, "broadcast", {0: races_only.empty(256)})


def test_checks_come_from_the_environment(monkeypatch):
    racy = BROADCAST.replace("BARRIER", "")
    monkeypatch.delenv("METALQWEN_CPU_CHECKS", raising=False)
    plain = gpu.Device("cpu")
    run(plain, racy, "broadcast", {0: plain.empty(256)})  # off by default: the fixed order hides it
    monkeypatch.setenv("METALQWEN_CPU_CHECKS", "races,bounds")
    from_env = gpu.Device("cpu")
    with pytest.raises(gpu.GpuError, match="data race"):
        run(from_env, racy, "broadcast", {0: from_env.empty(256)})


def test_unknown_check_is_refused():
    with pytest.raises(gpu.GpuError, match="unknown check 'speed'"):
        gpu.Device("cpu", checks=("races", "speed"))
    with pytest.raises(TypeError):
        gpu.Device("cpu", checks="races")


# --- our shaders --------------------------------------------------------------------------

SCAN_TWICE = """
kernel void scan_twice(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                       uint n_sg [[simdgroups_per_threadgroup]]) {
    threadgroup float scratch[32];
    float total;
    const float first = mq_sample::tg_exclusive_scan(1.0f, scratch, sg, n_sg, lane, total);
    const float second = mq_sample::tg_exclusive_scan(2.0f, scratch, sg, n_sg, lane, total);
    out[tid] = first + second;
}
"""


def test_tg_exclusive_scan_back_to_back_is_race_free(checked):
    """tg_exclusive_scan (sampling.metal) reuses its scratch: its leading barrier keeps the next
    call's writes from overtaking this call's reads in other SIMD-groups."""
    from ..shaders.conftest import checkout_shader_files

    files = {path: text for path, text in checkout_shader_files().items()
             if path.endswith(".h") or path == "sampling.metal"}
    files["sampling.metal"] += SCAN_TWICE
    lib = checked.compile(_core.shader_library_source(files), "metalqwen-shaders")
    out = checked.empty(256 * 4)
    lib.kernel("scan_twice").dispatch({0: out}, 1, 256)
    np.testing.assert_array_equal(out.numpy(np.float32), 3.0 * np.arange(256))
