"""CPU-runtime schedules (forward, reverse, random:SEED) and per-lane simdgroup matrix
loads and stores: correct code gives the same results under every schedule, code that
leans on the runtime's index order (a missing barrier) fails under another one."""

import numpy as np
import pytest

from metalqwen import gpu

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"
SCHEDULES = ["forward", "reverse", "random:1", "random:2"]


def device(schedule):
    return gpu.Device("cpu", schedule=schedule)


def build(dev, body, name="schedules.metal"):
    return dev.compile(HEADER + body, name)


def nan_buffer(dev, count):
    return dev.buffer(np.full(count, np.nan, np.float32))


# ---------------------------------------------------------------- choosing a schedule


@pytest.mark.parametrize("bad", ["backwards", "random", "random:", "random:x1", "random:-3", "Reverse"])
def test_unknown_schedules_are_refused(bad):
    with pytest.raises(gpu.GpuError, match=r"\[cpu\] unknown schedule"):
        device(bad)


def test_schedule_needs_the_cpu_runtime():
    with pytest.raises(ValueError, match="CPU runtime"):
        gpu.Device(None, schedule="reverse")


def test_environment_variable_selects_and_validates(monkeypatch):
    monkeypatch.setenv("METALQWEN_CPU_SCHEDULE", "sideways")
    with pytest.raises(gpu.GpuError, match="unknown schedule 'sideways'.*METALQWEN_CPU_SCHEDULE"):
        gpu.Device("cpu")
    monkeypatch.setenv("METALQWEN_CPU_SCHEDULE", "reverse")
    assert lane_order(gpu.Device("cpu"))[0].tolist() == list(range(31, -1, -1))
    # An explicit schedule wins over the variable.
    assert lane_order(device("forward"))[0].tolist() == list(range(32))


# ---------------------------------------------------------------- the orders themselves

ORDER_SRC = """
// Each thread takes a ticket once past the barrier: the tickets give the order threads ran in.
//   order [groups][threads]: thread index of the t-th arrival in each group.
kernel void arrival_order(device uint* order [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                          uint group [[threadgroup_position_in_grid]], uint n [[threads_per_threadgroup]]) {
    threadgroup atomic_uint tickets;
    if (tid == 0) atomic_store_explicit(&tickets, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const uint t = atomic_fetch_add_explicit(&tickets, 1u, memory_order_relaxed);
    order[group * n + t] = tid;
}
// Lane 0 of each SIMD-group takes a ticket before each of 4 collectives:
//   order [4 * simdgroups]: sg * 4 + step of the t-th ticket.
kernel void step_order(device uint* order [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup atomic_uint tickets;
    if (tid == 0) atomic_store_explicit(&tickets, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint step = 0; step < 4; step++) {
        if (lane == 0) order[atomic_fetch_add_explicit(&tickets, 1u, memory_order_relaxed)] = sg * 4 + step;
        simdgroup_barrier(mem_flags::mem_none);
    }
}
// order[t]: the group that started t-th.
kernel void group_order(device atomic_uint* next [[buffer(0)]], device uint* order [[buffer(1)]],
                        uint group [[threadgroup_position_in_grid]]) {
    order[atomic_fetch_add_explicit(next, 1u, memory_order_relaxed)] = group;
}
"""


def lane_order(dev, threads=32, groups=1):
    order = dev.buffer(np.full(groups * threads, 0xFFFFFFFF, np.uint32))
    build(dev, ORDER_SRC).kernel("arrival_order").dispatch({0: order}, threadgroups=(groups,), threads=(threads,))
    return order.numpy(np.uint32, (groups, threads))


def test_forward_and_reverse_orders_of_lanes_and_simdgroups():
    np.testing.assert_array_equal(lane_order(device("forward"), 128)[0], np.arange(128))
    np.testing.assert_array_equal(lane_order(device("reverse"), 128)[0], np.arange(128)[::-1])


def test_random_order_is_reproducible_per_seed_and_varies_between_groups():
    first = lane_order(device("random:7"), 96, groups=4)
    for row in first:  # every thread exactly once
        assert sorted(row.tolist()) == list(range(96))
    np.testing.assert_array_equal(first, lane_order(device("random:7"), 96, groups=4))
    assert (first != lane_order(device("random:8"), 96, groups=4)).any()
    assert len({tuple(row) for row in first}) == 4, "each group should get its own order"
    assert len({tuple(row[::32] // 32) for row in first}) > 1, "SIMD-groups should run in varying orders"
    dev = device("random:7")
    assert (lane_order(dev, 96) != lane_order(dev, 96)).any(), "successive dispatches should differ"


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_simdgroups_run_one_after_another_or_interleave_at_collectives(schedule):
    dev = device(schedule)
    order = dev.buffer(np.full(16, 0xFFFFFFFF, np.uint32))
    build(dev, ORDER_SRC).kernel("step_order").dispatch({0: order}, threadgroups=(1,), threads=(128,))
    got = order.numpy(np.uint32)
    assert sorted(got.tolist()) == list(range(16))
    for sg in range(4):  # each SIMD-group's own steps stay in program order
        assert [t % 4 for t in got if t // 4 == sg] == [0, 1, 2, 3]
    if schedule == "forward":
        assert got.tolist() == list(range(16))
    elif schedule == "reverse":
        assert (got // 4).tolist() == [3] * 4 + [2] * 4 + [1] * 4 + [0] * 4
    else:
        assert (np.diff(got // 4) != 0).sum() > 3, "random should interleave SIMD-groups between collectives"


@pytest.mark.parametrize("schedule", ["forward", "reverse"])
def test_threadgroup_order(schedule):
    dev, groups = device(schedule), 256
    order = dev.buffer(np.full(groups, 0xFFFFFFFF, np.uint32))
    build(dev, ORDER_SRC).kernel("group_order").dispatch({0: dev.buffer(np.zeros(1, np.uint32)), 1: order},
                                                         threadgroups=(groups,), threads=(1,))
    got = order.numpy(np.uint32).astype(np.int64)
    assert sorted(got.tolist()) == list(range(groups))
    # Workers take groups in schedule order; workers racing only swap near neighbours.
    correlation = np.corrcoef(np.arange(groups), got)[0, 1]
    assert correlation < -0.9 if schedule == "reverse" else correlation > 0.9


# ---------------------------------------------------------------- a missing barrier shows

BROADCAST_SRC = """
// Thread 0 publishes a value every thread reads: needs a threadgroup_barrier in between.
kernel void broadcast(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      constant uint& with_barrier [[buffer(2)]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float shared_value;
    if (tid == 0) shared_value = x[0];
    if (with_barrier != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = shared_value;
}
// Each lane writes its neighbour's input into simdgroup-shared memory; needs a simdgroup_barrier.
kernel void lane_exchange(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                          constant uint& with_barrier [[buffer(2)]], uint tid [[thread_index_in_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    threadgroup float tile[64];
    tile[tid] = x[tid];
    if (with_barrier != 0) simdgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = tile[sg * 32 + (lane + 1) % 32];
}
"""


def run_missing_barrier(schedule, kernel, with_barrier, threads=64):
    dev = device(schedule)
    x = np.arange(1, threads + 1, dtype=np.float32)
    y = nan_buffer(dev, threads)
    build(dev, BROADCAST_SRC).kernel(kernel).dispatch({0: dev.buffer(x), 1: y, 2: np.uint32(with_barrier)},
                                                      threadgroups=(1,), threads=(threads,))
    got = y.numpy(np.float32)
    want = np.full(threads, 1.0, np.float32) if kernel == "broadcast" else x.reshape(-1, 32)[:, np.r_[1:32, 0]].ravel()
    return got, want


@pytest.mark.parametrize("kernel", ["broadcast", "lane_exchange"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_correct_barriers_pass_under_every_schedule(schedule, kernel):
    got, want = run_missing_barrier(schedule, kernel, with_barrier=True)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kernel", ["broadcast", "lane_exchange"])
def test_a_missing_barrier_passes_forward_but_fails_reverse_and_random(kernel):
    got, want = run_missing_barrier("forward", kernel, with_barrier=False)
    if kernel == "broadcast":  # index order hides it: thread 0 always writes first
        np.testing.assert_array_equal(got, want)
    for schedule in ("reverse", "random:1"):
        got, want = run_missing_barrier(schedule, kernel, with_barrier=False)
        assert not np.array_equal(got, want), f"{kernel} without its barrier passed under {schedule}"


# ---------------------------------------------------------------- per-lane simdgroup matrix load/store

MATRIX_SRC = """
// Lane l writes entries 2l, 2l+1 of an 8x8 tile (row-major), then the SIMD-group loads it
// as a matrix: a lane's fragment holds entries other lanes wrote, so the load needs a
// simdgroup_barrier before it. The store back is read element by element: another barrier.
//   x, y [64] f32
kernel void tile_roundtrip(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           constant uint& barriers [[buffer(2)]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float tile[64];
    threadgroup float back[64];
    tile[2 * lane] = x[2 * lane];
    tile[2 * lane + 1] = x[2 * lane + 1];
    if ((barriers & 1u) != 0) simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_float8x8 m;
    simdgroup_load(m, tile);
    simdgroup_float8x8 twice;
    simdgroup_multiply(twice, simdgroup_float8x8(2.0f), m);
    simdgroup_store(twice, back);
    if ((barriers & 2u) != 0) simdgroup_barrier(mem_flags::mem_threadgroup);
    y[2 * lane] = back[2 * lane];
    y[2 * lane + 1] = back[2 * lane + 1];
}
// Lanes 0..3 stop early: the others load a matrix without them.
kernel void early_exit(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    if (lane < 4) return;
    simdgroup_float8x8 m;
    simdgroup_load(m, y);
    y[lane] = m.thread_elements()[0];
}
"""


def run_tile(schedule, barriers):
    dev = device(schedule)
    x = np.arange(64, dtype=np.float32)
    y = nan_buffer(dev, 64)
    build(dev, MATRIX_SRC, "matrix.metal").kernel("tile_roundtrip").dispatch(
        {0: dev.buffer(x), 1: y, 2: np.uint32(barriers)}, threadgroups=(1,), threads=(32,))
    return y.numpy(np.float32), 2 * x


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_simdgroup_matrix_with_barriers_passes_under_every_schedule(schedule):
    got, want = run_tile(schedule, barriers=3)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("barriers", [2, 1], ids=["no barrier before the load", "no barrier after the store"])
def test_missing_simdgroup_barrier_around_matrix_load_or_store_is_caught(schedule, barriers):
    # Each lane loads (or stores) its own elements when it gets there, as on a GPU.
    got, want = run_tile(schedule, barriers)
    assert not np.array_equal(got, want)


def test_matrix_load_without_all_lanes_is_reported_where_lanes_wait():
    dev = device("forward")
    lib = build(dev, MATRIX_SRC, "matrix.metal")
    with pytest.raises(gpu.GpuError, match=r"simdgroup_load: lane 0 is inactive.*need all 32 lanes.*matrix\.metal:\d+"):
        lib.kernel("early_exit").dispatch({0: nan_buffer(dev, 64)}, threadgroups=(1,), threads=(32,))
