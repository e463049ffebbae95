"""The CPU runtime's MSL standard library (csrc/gpu/cpu/msl) against numpy.

SIMD-group and quad-group functions with full and partial SIMD-groups, simdgroup
matrices, vectors and swizzles, half/bfloat rounding, as_type, math functions and
atomics. Float reductions follow the library's documented pairwise tree, which the
references below replay exactly; other numerics are bounded per dtype.
"""

from fractions import Fraction

import numpy as np
import pytest

from metalqwen import gpu

from ..support.reference import bf16_bits, bf16_to_f32, round_bf16

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"
SENTINEL = 0xDEADBEEF  # fills integer outputs: no test expects this value


@pytest.fixture(scope="module")
def dev():
    return gpu.Device("cpu")


def compile_lib(dev, body, name):
    return dev.compile(HEADER + body, name)


def nan_floats(dev, count, dtype=np.float32):
    return dev.buffer(np.full(count, np.nan, dtype))


def sentinel_words(dev, count, dtype=np.uint32):
    return dev.buffer(np.full(count, SENTINEL, np.uint64).astype(dtype))


def groups(n, width=32):
    """Index ranges of the SIMD-groups of a 1-D grid of n threads (threadgroups of 64)."""
    return [range(s, min(s + width, n)) for s in range(0, n, width)]


def tree_reduce(values, op, width=32):
    """The library's reduction order: pairwise tree over lane numbers, inactive (None) skipped."""
    part = list(values) + [None] * (width - len(values))
    step = 1
    while step < width:
        for i in range(0, width - step, 2 * step):
            if part[i + step] is not None:
                part[i] = part[i + step] if part[i] is None else op(part[i], part[i + step])
        step *= 2
    return part[0]


# ---------------------------------------------------------------- reductions and scans

REDUCE_SRC = """
kernel void reduce_float(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                         constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i >= n) return;
    const float v = x[i];
    out[0 * n + i] = simd_sum(v);
    out[1 * n + i] = simd_product(v);
    out[2 * n + i] = simd_min(v);
    out[3 * n + i] = simd_max(v);
    out[4 * n + i] = simd_prefix_inclusive_sum(v);
    out[5 * n + i] = simd_prefix_exclusive_sum(v);
    out[6 * n + i] = simd_prefix_inclusive_product(v);
    out[7 * n + i] = simd_prefix_exclusive_product(v);
    out[8 * n + i] = simd_broadcast_first(v);
    out[9 * n + i] = quad_sum(v);
    out[10 * n + i] = quad_max(v);
    out[11 * n + i] = quad_prefix_exclusive_sum(v);
}

kernel void reduce_int(device const int* x [[buffer(0)]], device int* out [[buffer(1)]],
                       constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i >= n) return;
    const int v = x[i];
    out[0 * n + i] = simd_sum(v);
    out[1 * n + i] = simd_min(v);
    out[2 * n + i] = simd_max(v);
    out[3 * n + i] = simd_and(v);
    out[4 * n + i] = simd_or(v);
    out[5 * n + i] = simd_xor(v);
    out[6 * n + i] = simd_prefix_inclusive_sum(v);
    out[7 * n + i] = simd_prefix_exclusive_sum(v);
    out[8 * n + i] = int(simd_sum(uint(v)));
    out[9 * n + i] = quad_and(v);
    out[10 * n + i] = quad_or(v);
    out[11 * n + i] = quad_min(v);
}

// Lanes with x < 0 exit first: reductions cover the lanes still running.
kernel void reduce_survivors(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                             uint i [[thread_position_in_grid]]) {
    const float v = x[i];
    if (v < 0.0f) return;
    out[2 * i] = simd_sum(v);
    out[2 * i + 1] = simd_prefix_exclusive_sum(v);
}

kernel void reduce_vector_half(device const half4* x [[buffer(0)]], device half4* out [[buffer(1)]],
                               device const float4* f [[buffer(2)]], device float4* fout [[buffer(3)]],
                               uint i [[thread_position_in_grid]]) {
    out[i] = simd_sum(x[i]);
    fout[i] = simd_max(f[i]);
}
"""


@pytest.fixture(scope="module")
def reduce_lib(dev):
    return compile_lib(dev, REDUCE_SRC, "reduce.metal")


@pytest.mark.parametrize("n", [64, 40, 7])
def test_float_reductions_and_scans(dev, reduce_lib, n):
    rng = np.random.default_rng(n)
    # Powers of two make products exact; the sums replay the documented tree exactly.
    x = (rng.choice([0.5, 1.0, 2.0, -1.0], n) * rng.uniform(0.5, 1.5, n)).astype(np.float32)
    x[3] = 0.75
    out = nan_floats(dev, 12 * n)
    reduce_lib.kernel("reduce_float").dispatch_threads({0: dev.buffer(x), 1: out, 2: np.uint32(n)}, grid=(n,), threads=(64,))
    got = out.numpy(np.float32, (12, n))
    f32 = np.float32
    for g in groups(n):
        vals = [f32(v) for v in x[g]]
        np.testing.assert_array_equal(got[0, g], tree_reduce(vals, lambda a, b: f32(a + b)))
        np.testing.assert_array_equal(got[1, g], tree_reduce(vals, lambda a, b: f32(a * b)))
        np.testing.assert_array_equal(got[2, g], min(vals))
        np.testing.assert_array_equal(got[3, g], max(vals))
        inclusive_sum, inclusive_prod = np.cumsum(vals, dtype=np.float32), np.cumprod(vals, dtype=np.float32)
        np.testing.assert_array_equal(got[4, g], inclusive_sum)
        np.testing.assert_array_equal(got[5, g], np.concatenate([[0], inclusive_sum[:-1]]))
        np.testing.assert_array_equal(got[6, g], inclusive_prod)
        np.testing.assert_array_equal(got[7, g], np.concatenate([[1], inclusive_prod[:-1]]))
        np.testing.assert_array_equal(got[8, g], vals[0])
    for q in groups(n, 4):
        vals = [f32(v) for v in x[q]]
        np.testing.assert_array_equal(got[9, q], tree_reduce(vals, lambda a, b: f32(a + b), width=4))
        np.testing.assert_array_equal(got[10, q], max(vals))
        np.testing.assert_array_equal(got[11, q], np.concatenate([[0], np.cumsum(vals, dtype=np.float32)[:-1]]))


@pytest.mark.parametrize("n", [64, 40])
def test_integer_reductions(dev, reduce_lib, n):
    rng = np.random.default_rng(7 + n)
    x = rng.integers(-(2**30), 2**30, n, dtype=np.int32)
    x[:4] = [2**31 - 1, 5, -(2**31), 2**31 - 1]  # sums wrap like the GPU's 32-bit adds
    out = sentinel_words(dev, 12 * n, np.int32)
    reduce_lib.kernel("reduce_int").dispatch_threads({0: dev.buffer(x), 1: out, 2: np.uint32(n)}, grid=(n,), threads=(64,))
    got = out.numpy(np.int32, (12, n))
    for g in groups(n):
        v = x[g].astype(np.int64)
        wrap = lambda a: ((a + 2**31) % 2**32 - 2**31).astype(np.int64)  # noqa: E731
        np.testing.assert_array_equal(got[0, g], wrap(v.sum()))
        np.testing.assert_array_equal(got[1, g], v.min())
        np.testing.assert_array_equal(got[2, g], v.max())
        np.testing.assert_array_equal(got[3, g], np.bitwise_and.reduce(x[g]))
        np.testing.assert_array_equal(got[4, g], np.bitwise_or.reduce(x[g]))
        np.testing.assert_array_equal(got[5, g], np.bitwise_xor.reduce(x[g]))
        np.testing.assert_array_equal(got[6, g], wrap(np.cumsum(v)))
        np.testing.assert_array_equal(got[7, g], wrap(np.concatenate([[0], np.cumsum(v)[:-1]])))
        np.testing.assert_array_equal(got[8, g], wrap(v.sum()))
    for q in groups(n, 4):
        np.testing.assert_array_equal(got[9, q], np.bitwise_and.reduce(x[q]))
        np.testing.assert_array_equal(got[10, q], np.bitwise_or.reduce(x[q]))
        np.testing.assert_array_equal(got[11, q], x[q].min())


def test_reductions_skip_lanes_that_exited(dev, reduce_lib):
    x = np.arange(1, 65, dtype=np.float32)
    x[[0, 5, 6, 31, 40]] = -1.0
    out = nan_floats(dev, 128)
    reduce_lib.kernel("reduce_survivors").dispatch({0: dev.buffer(x), 1: out}, threadgroups=(1,), threads=(64,))
    got = out.numpy(np.float32, (64, 2))
    for g in groups(64):
        alive = [i for i in g if x[i] >= 0]
        dead = [i for i in g if x[i] < 0]
        np.testing.assert_array_equal(got[alive, 0], x[alive].sum())
        np.testing.assert_array_equal(got[alive, 1], np.concatenate([[0], np.cumsum(x[alive])[:-1]]))
        assert np.isnan(got[dead]).all()


def test_reductions_of_vectors_and_half(dev, reduce_lib):
    rng = np.random.default_rng(3)
    h = rng.uniform(-2, 2, (32, 4)).astype(np.float16)
    f = rng.uniform(-2, 2, (32, 4)).astype(np.float32)
    out, fout = dev.buffer(np.full((32, 4), np.nan, np.float16)), nan_floats(dev, 128)
    reduce_lib.kernel("reduce_vector_half").dispatch(
        {0: dev.buffer(h), 1: out, 2: dev.buffer(f), 3: fout}, threadgroups=(1,), threads=(32,))
    want = [tree_reduce(list(h[:, c]), lambda a, b: np.float16(a + b)) for c in range(4)]
    np.testing.assert_array_equal(out.numpy(np.float16, (32, 4)), np.broadcast_to(want, (32, 4)))
    np.testing.assert_array_equal(fout.numpy(np.float32, (32, 4)), np.broadcast_to(f.max(axis=0), (32, 4)))


# ---------------------------------------------------------------- shuffles and broadcasts

SHUFFLES = {
    # name: (MSL call on value v and lane argument a, group width)
    "simd_shuffle": ("simd_shuffle(v, a)", 32),
    "simd_broadcast": ("simd_broadcast(v, a)", 32),
    "simd_shuffle_xor": ("simd_shuffle_xor(v, a)", 32),
    "simd_shuffle_up": ("simd_shuffle_up(v, a)", 32),
    "simd_shuffle_down": ("simd_shuffle_down(v, a)", 32),
    "simd_shuffle_rotate_up": ("simd_shuffle_rotate_up(v, a)", 32),
    "simd_shuffle_rotate_down": ("simd_shuffle_rotate_down(v, a)", 32),
    "quad_shuffle": ("quad_shuffle(v, a)", 4),
    "quad_broadcast": ("quad_broadcast(v, a)", 4),
    "quad_shuffle_xor": ("quad_shuffle_xor(v, a)", 4),
    "quad_shuffle_up": ("quad_shuffle_up(v, a)", 4),
    "quad_shuffle_down": ("quad_shuffle_down(v, a)", 4),
}
SHUFFLE_SRC = "".join(
    f"""
kernel void k_{name}(device const float* x [[buffer(0)]], device const uint* arg [[buffer(1)]],
                     device float* out [[buffer(2)]], constant uint& n [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {{
    if (i >= n) return;
    const float v = x[i];
    const ushort a = ushort(arg[i]);
    out[i] = {call};
}}
"""
    for name, (call, _) in SHUFFLES.items()
) + """
kernel void k_fill(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                   constant ushort2& delta_modulo [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    const float v = x[i], fill = -x[i];
    out[2 * i] = simd_shuffle_and_fill_down(v, fill, delta_modulo.x, delta_modulo.y);
    out[2 * i + 1] = simd_shuffle_and_fill_up(v, fill, delta_modulo.x, delta_modulo.y);
}

kernel void k_shuffle_types(device const uint4* x [[buffer(0)]], device uint4* out [[buffer(1)]],
                            device half2* h [[buffer(2)]], uint lane [[thread_index_in_simdgroup]]) {
    out[lane] = simd_shuffle_xor(x[lane], ushort(5));
    h[lane] = simd_shuffle_down(h[lane], ushort(3));
}
"""


def shuffle_reference(name, x, arg, width):
    """Expected results for lanes that all exist (source lanes in range)."""
    n = len(x)
    out = np.empty_like(x)
    for i in range(n):
        base, pos, a = i - i % width, i % width, int(arg[i])
        kind = name.split("_", 1)[1]
        if kind in ("shuffle", "broadcast"):
            src = base + a
        elif kind == "shuffle_xor":
            src = base + (pos ^ a)
        elif kind == "shuffle_up":
            src = i - a if pos - a >= 0 else i
        elif kind == "shuffle_down":
            src = i + a if pos + a < width else i
        elif kind == "shuffle_rotate_up":
            src = base + (pos - a) % width
        else:
            src = base + (pos + a) % width
        out[i] = x[src]
    return out


SHUFFLE_ARGS = {
    "simd_shuffle": lambda rng, n: rng.integers(0, 32, n),
    "simd_broadcast": lambda rng, n: np.full(n, 13),
    "simd_shuffle_xor": lambda rng, n: np.full(n, 21),
    "simd_shuffle_up": lambda rng, n: np.full(n, 5),
    "simd_shuffle_down": lambda rng, n: np.full(n, 9),
    "simd_shuffle_rotate_up": lambda rng, n: np.full(n, 7),
    "simd_shuffle_rotate_down": lambda rng, n: np.full(n, 30),
    "quad_shuffle": lambda rng, n: rng.integers(0, 4, n),
    "quad_broadcast": lambda rng, n: np.full(n, 2),
    "quad_shuffle_xor": lambda rng, n: np.full(n, 3),
    "quad_shuffle_up": lambda rng, n: np.full(n, 1),
    "quad_shuffle_down": lambda rng, n: np.full(n, 2),
}


@pytest.fixture(scope="module")
def shuffle_lib(dev):
    return compile_lib(dev, SHUFFLE_SRC, "shuffle.metal")


def run_shuffle(dev, lib, name, x, arg, n, threads=64):
    out = nan_floats(dev, n)
    lib.kernel(f"k_{name}").dispatch_threads(
        {0: dev.buffer(x), 1: dev.buffer(arg.astype(np.uint32)), 2: out, 3: np.uint32(n)}, grid=(n,), threads=(threads,))
    return out.numpy(np.float32)


@pytest.mark.parametrize("name", list(SHUFFLES))
def test_shuffles_full_groups(dev, shuffle_lib, name):
    rng = np.random.default_rng(len(name))
    n = 64
    x = rng.standard_normal(n).astype(np.float32)
    arg = SHUFFLE_ARGS[name](rng, n)
    got = run_shuffle(dev, shuffle_lib, name, x, arg, n)
    np.testing.assert_array_equal(got, shuffle_reference(name, x, arg, SHUFFLES[name][1]))


@pytest.mark.parametrize("delta", [0, 1, 15, 31, 32, 40])
def test_shuffle_up_and_down_keep_lanes_without_a_source(dev, shuffle_lib, delta):
    x = np.arange(64, dtype=np.float32) * 3
    arg = np.full(64, delta)
    for name in ("simd_shuffle_up", "simd_shuffle_down"):
        got = run_shuffle(dev, shuffle_lib, name, x, arg, 64)
        np.testing.assert_array_equal(got, shuffle_reference(name, x, arg, 32))
        lanes = np.arange(64) % 32
        kept = lanes < delta if name.endswith("up") else lanes + delta >= 32
        np.testing.assert_array_equal(got[kept], x[kept])


def test_shuffles_in_a_partial_simdgroup_read_only_active_lanes(dev, shuffle_lib):
    # 40 threads: SIMD-group 1 has lanes 0..7 only.
    n = 40
    x = np.arange(n, dtype=np.float32) + 0.5
    cases = {
        "simd_shuffle_up": np.full(n, 3),
        "simd_shuffle_xor": np.full(n, 4),
        "simd_broadcast": np.full(n, 6),
        "simd_shuffle": np.where(np.arange(n) < 32, 31 - np.arange(n) % 32, 7 - np.arange(n) % 8),
        "quad_shuffle_down": np.full(n, 1),
        "quad_shuffle_xor": np.full(n, 2),
    }
    for name, arg in cases.items():
        got = run_shuffle(dev, shuffle_lib, name, x, arg, n)
        np.testing.assert_array_equal(got, shuffle_reference(name, x, arg, SHUFFLES[name][1]), err_msg=name)


@pytest.mark.parametrize(
    "name, arg, message",
    [
        ("simd_shuffle_down", 1, "simd_shuffle_down: lane 7 reads lane 8, which is inactive"),
        ("simd_shuffle_xor", 8, "simd_shuffle_xor: lane 0 reads lane 8, which is inactive"),
        ("simd_shuffle", 20, "simd_shuffle: lane 0 reads lane 20, which is inactive"),
        ("simd_broadcast", 31, "simd_broadcast: lane 0 reads lane 31, which is inactive"),
        ("simd_shuffle_rotate_down", 1, "simd_shuffle_rotate_down: lane 7 reads lane 8, which is inactive"),
    ],
)
def test_reading_an_inactive_lane_fails(dev, shuffle_lib, name, arg, message):
    with pytest.raises(gpu.GpuError, match=message):
        run_shuffle(dev, shuffle_lib, name, np.zeros(40, np.float32), np.full(40, arg), 40)


def test_shuffle_lane_outside_the_group_fails(dev, shuffle_lib):
    with pytest.raises(gpu.GpuError, match="quad_shuffle: lane 0 asks for lane argument 4, outside its 4-lane group"):
        run_shuffle(dev, shuffle_lib, "quad_shuffle", np.zeros(32, np.float32), np.full(32, 4), 32)


@pytest.mark.parametrize("delta, modulo", [(3, 8), (1, 4), (17, 32), (0, 16)])
def test_shuffle_and_fill(dev, shuffle_lib, delta, modulo):
    x = np.arange(1, 33, dtype=np.float32)
    out = nan_floats(dev, 64)
    shuffle_lib.kernel("k_fill").dispatch(
        {0: dev.buffer(x), 1: out, 2: np.array([delta, modulo], np.uint16)}, threadgroups=(1,), threads=(32,))
    got = out.numpy(np.float32, (32, 2))
    down, up = np.empty(32, np.float32), np.empty(32, np.float32)
    for i in range(32):
        base, pos = i - i % modulo, i % modulo
        j = pos + delta
        down[i] = x[base + j] if j < modulo else -x[base + j - modulo]
        j = pos - delta
        up[i] = x[base + j] if j >= 0 else -x[base + j + modulo]
    np.testing.assert_array_equal(got[:, 0], down)
    np.testing.assert_array_equal(got[:, 1], up)


def test_shuffles_of_vectors_and_half(dev, shuffle_lib):
    x = np.arange(128, dtype=np.uint32).reshape(32, 4)
    h = np.arange(64, dtype=np.float16).reshape(32, 2) / 8
    out = sentinel_words(dev, 128)
    hb = dev.buffer(h)
    shuffle_lib.kernel("k_shuffle_types").dispatch({0: dev.buffer(x), 1: out, 2: hb}, threadgroups=(1,), threads=(32,))
    np.testing.assert_array_equal(out.numpy(np.uint32, (32, 4)), x[np.arange(32) ^ 5])
    src = np.where(np.arange(32) + 3 < 32, np.arange(32) + 3, np.arange(32))
    np.testing.assert_array_equal(hb.numpy(np.float16, (32, 2)), h[src])


# ---------------------------------------------------------------- votes

VOTE_SRC = """
kernel void vote(device const float* x [[buffer(0)]], device ulong* out [[buffer(1)]],
                 constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i >= n || x[i] < 0.0f) return;  // exited lanes do not vote
    const bool p = x[i] > 0.5f;
    const simd_vote v = simd_ballot(p);
    out[8 * i + 0] = ulong(v);
    out[8 * i + 1] = ulong(simd_active_threads_mask());
    out[8 * i + 2] = v.all();
    out[8 * i + 3] = v.any();
    out[8 * i + 4] = simd_all(p);
    out[8 * i + 5] = simd_any(p);
    out[8 * i + 6] = simd_is_first();
    out[8 * i + 7] = bool(v) && !simd_is_helper_thread();
}
"""


@pytest.mark.parametrize("pattern", ["mixed", "all_true", "all_false"])
@pytest.mark.parametrize("n", [64, 40])
def test_ballot_and_votes(dev, pattern, n):
    rng = np.random.default_rng(n)
    x = {"mixed": rng.uniform(0, 1, n), "all_true": np.ones(n), "all_false": np.zeros(n)}[pattern].astype(np.float32)
    x[[0, 9, 33]] = -1.0  # these lanes exit before voting
    lib = compile_lib(dev, VOTE_SRC, "vote.metal")
    out = sentinel_words(dev, 8 * n, np.uint64)
    lib.kernel("vote").dispatch_threads({0: dev.buffer(x), 1: out, 2: np.uint32(n)}, grid=(n,), threads=(64,))
    got = out.numpy(np.uint64, (n, 8))
    for g in groups(n):
        live = [i for i in g if x[i] >= 0]
        bits = sum(1 << (i - g.start) for i in live if x[i] > 0.5)
        active = sum(1 << (i - g.start) for i in live)
        votes = [x[i] > 0.5 for i in live]
        want = [bits, active, all(votes), any(votes), all(votes), any(votes), None, any(votes)]
        for i in live:
            want[6] = i == live[0]
            np.testing.assert_array_equal(got[i], np.array(want, np.uint64), err_msg=f"thread {i}")
        for i in set(g) - set(live):
            assert (got[i] == SENTINEL).all()


# ---------------------------------------------------------------- simdgroup matrices

MATRIX_TYPES = {"float": np.float32, "half": np.float16, "bfloat": np.uint16}


def matrix_src(t, acc):
    return f"""
struct MatParams {{ uint lda, a_origin_x, a_origin_y, a_transposed, ldd, d_origin_x, d_origin_y, d_transposed; }};
kernel void mma(device const {t}* a [[buffer(0)]], device const {t}* b [[buffer(1)]],
                device const {acc}* c [[buffer(2)]], device {acc}* d [[buffer(3)]],
                constant MatParams& p [[buffer(4)]]) {{
    simdgroup_matrix<{t}, 8, 8> ma, mb;
    simdgroup_matrix<{acc}, 8, 8> mc, md;
    simdgroup_load(ma, a, p.lda, ulong2(p.a_origin_x, p.a_origin_y), p.a_transposed != 0);
    simdgroup_load(mb, b);
    simdgroup_load(mc, c, 8, 0, false);
    simdgroup_multiply_accumulate(md, ma, mb, mc);
    simdgroup_store(md, d, p.ldd, ulong2(p.d_origin_x, p.d_origin_y), p.d_transposed != 0);
}}
kernel void mul(device const {t}* a [[buffer(0)]], device const {t}* b [[buffer(1)]], device {acc}* d [[buffer(2)]]) {{
    simdgroup_matrix<{t}, 8, 8> ma, mb;
    simdgroup_matrix<{acc}, 8, 8> md;
    simdgroup_load(ma, a);
    simdgroup_load(mb, b);
    simdgroup_multiply(md, ma, mb);
    simdgroup_store(md, d);
}}
"""


def to_device(values, t):
    return bf16_bits(values) if t == "bfloat" else values.astype(MATRIX_TYPES[t])


def from_device(raw, t):
    return bf16_to_f32(raw) if t == "bfloat" else raw.astype(np.float64)


@pytest.mark.parametrize(
    "t, acc", [("float", "float"), ("half", "float"), ("half", "half"), ("bfloat", "float"), ("bfloat", "bfloat")]
)
@pytest.mark.parametrize("a_transposed", [False, True])
@pytest.mark.parametrize("d_transposed", [False, True])
def test_simdgroup_multiply_accumulate(dev, t, acc, a_transposed, d_transposed):
    rng = np.random.default_rng([len(t), len(acc), a_transposed, d_transposed])
    lda, ldd, (ax, ay), (dx, dy) = 13, 11, (3, 2), (2, 1)
    big_a = to_device(rng.uniform(-2, 2, (16, lda)).astype(np.float32), t)
    b = to_device(rng.uniform(-2, 2, (8, 8)).astype(np.float32), t)
    c = to_device(rng.uniform(-2, 2, (8, 8)).astype(np.float32), acc)
    fa, fb, fc = from_device(big_a, t), from_device(b, t), from_device(c, acc)
    # Logical A: rows from origin y, columns from origin x; transposed reads memory[(x + c), (y + r)].
    a_logical = fa[ay:ay + 8, ax:ax + 8] if not a_transposed else fa[ax:ax + 8, ay:ay + 8].T
    exact = a_logical @ fb + fc
    d_init = np.full((12, ldd), np.nan, np.float32)
    d = dev.buffer(to_device(d_init, acc) if acc != "float" else d_init)
    params = np.array([lda, ax, ay, a_transposed, ldd, dx, dy, d_transposed], np.uint32)
    lib = compile_lib(dev, matrix_src(t, acc), f"mma_{t}_{acc}.metal")
    lib.kernel("mma").dispatch({0: dev.buffer(big_a), 1: dev.buffer(b), 2: dev.buffer(c), 3: d, 4: params},
                               threadgroups=(1,), threads=(32,))
    raw = d.numpy(MATRIX_TYPES[acc], (12, ldd))
    got_all = from_device(raw, acc)
    got = got_all[dy:dy + 8, dx:dx + 8] if not d_transposed else got_all[dx:dx + 8, dy:dy + 8].T
    # Float accumulation of an 8-term dot product plus C: at most gamma_9 = 9u/(1-9u) of the
    # magnitudes (u = 2^-24), then one rounding to the result type (half 2^-11, bfloat 2^-8).
    magnitude = np.abs(a_logical) @ np.abs(fb) + np.abs(fc)
    accumulation = 9 * 2.0**-24 / (1 - 9 * 2.0**-24) * magnitude
    rel = {"float": 0.0, "half": 2.0**-11, "bfloat": 2.0**-8}[acc]
    bound = accumulation + rel * (np.abs(exact) + accumulation)
    assert (np.abs(got - exact) <= bound).all(), np.max(np.abs(got - exact) - bound)
    untouched = np.ones_like(got_all, bool)
    if d_transposed:
        untouched[dx:dx + 8, dy:dy + 8] = False
    else:
        untouched[dy:dy + 8, dx:dx + 8] = False
    assert np.isnan(got_all[untouched]).all()


@pytest.mark.parametrize("t", ["float", "half", "bfloat"])
def test_simdgroup_multiply(dev, t):
    rng = np.random.default_rng(11)
    a = to_device(rng.integers(-8, 8, (8, 8)).astype(np.float32), t)
    b = to_device(rng.integers(-8, 8, (8, 8)).astype(np.float32), t)
    d = nan_floats(dev, 64)
    compile_lib(dev, matrix_src(t, "float"), f"mul_{t}.metal").kernel("mul").dispatch(
        {0: dev.buffer(a), 1: dev.buffer(b), 2: d}, threadgroups=(1,), threads=(32,))
    # Small integers: every product and sum is exact in float.
    np.testing.assert_array_equal(d.numpy(np.float32, (8, 8)), from_device(a, t) @ from_device(b, t))


FRAGMENT_SRC = """
kernel void fragments(device const float* m [[buffer(0)]], device float* held [[buffer(1)]],
                      device float* stored [[buffer(2)]], device float* special [[buffer(3)]],
                      uint lane [[thread_index_in_simdgroup]]) {
    simdgroup_float8x8 a;
    simdgroup_load(a, m);
    held[2 * lane] = a.thread_elements()[0];
    held[2 * lane + 1] = a.thread_elements()[1];
    a.thread_elements() = float2(1000 + 2 * lane, 1001 + 2 * lane);
    simdgroup_store(a, stored);
    simdgroup_float8x8 diag = simdgroup_float8x8(2.5f);
    simdgroup_float8x8 filled = make_filled_simdgroup_matrix<float, 8>(-1.5f);
    simdgroup_store(diag, special);
    simdgroup_store(filled, special + 64);
}
kernel void partial(device float* out [[buffer(0)]]) {
    simdgroup_float8x8 a = make_filled_simdgroup_matrix<float, 8, 8>(1.0f);
    simdgroup_store(a, out);
}
"""


def test_thread_elements_follow_the_apple_fragment_layout(dev):
    lib = compile_lib(dev, FRAGMENT_SRC, "fragments.metal")
    m = np.arange(64, dtype=np.float32).reshape(8, 8)
    held, stored, special = nan_floats(dev, 64), nan_floats(dev, 64), nan_floats(dev, 128)
    lib.kernel("fragments").dispatch({0: dev.buffer(m), 1: held, 2: stored, 3: special}, threadgroups=(1,), threads=(32,))
    lane = np.arange(32)
    qid = lane // 4
    row = (qid & 4) + (lane // 2) % 4
    col = (qid & 2) * 2 + (lane % 2) * 2
    np.testing.assert_array_equal(held.numpy(np.float32, (32, 2)), np.stack([m[row, col], m[row, col + 1]], 1))
    want = np.empty((8, 8), np.float32)
    want[row, col], want[row, col + 1] = 1000 + 2 * lane, 1001 + 2 * lane
    np.testing.assert_array_equal(stored.numpy(np.float32, (8, 8)), want)
    got = special.numpy(np.float32, (2, 8, 8))
    np.testing.assert_array_equal(got[0], 2.5 * np.eye(8, dtype=np.float32))
    np.testing.assert_array_equal(got[1], np.full((8, 8), -1.5, np.float32))


def test_simdgroup_matrix_needs_all_32_lanes(dev):
    lib = compile_lib(dev, FRAGMENT_SRC, "fragments.metal")
    with pytest.raises(gpu.GpuError, match="simdgroup_store: lane 16 is inactive"):
        lib.kernel("partial").dispatch({0: nan_floats(dev, 64)}, threadgroups=(1,), threads=(16,))


DIVERGE_SRC = """
kernel void diverge_simd(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    float a;
    if (lane < 16) a = simd_sum(1.0f);
    else a = simd_shuffle_xor(2.0f, 1);
    y[lane] = a;
}
kernel void diverge_matrix(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    simdgroup_float8x8 d = make_filled_simdgroup_matrix<float, 8>(1.0f);
    if (lane < 16) simdgroup_store(d, y);
    else simdgroup_store(d, y + 64);
}
"""


@pytest.mark.parametrize("kernel, first, second", [
    ("diverge_simd", "simd_sum(1.0f)", "simd_shuffle_xor(2.0f, 1)"),
    ("diverge_matrix", "simdgroup_store(d, y)", "simdgroup_store(d, y + 64)"),
])
def test_collectives_report_their_msl_lines(dev, kernel, first, second):
    # Every collective takes its call site as a default argument: a divergent SIMD-group
    # is reported at the two MSL lines, not inside the library.
    source = HEADER + DIVERGE_SRC
    line = {call: source[:source.index(call)].count("\n") + 1 for call in (first, second)}
    lib = dev.compile(source, "diverge.metal")
    with pytest.raises(gpu.GpuError, match=rf"diverge\.metal:{line[first]}\b.*diverge\.metal:{line[second]}\b"):
        lib.kernel(kernel).dispatch({0: nan_floats(dev, 128)}, threadgroups=(1,), threads=(32,))


# ---------------------------------------------------------------- vectors, swizzles, as_type

VECTOR_SRC = """
kernel void swizzles(device const float4* in [[buffer(0)]], device float* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
    float4 v = in[i];
    device float* o = out + 24 * i;
    const float2 xy = v.xy;
    const float3 zyx = v.zyx;
    const float4 wwxy = v.wwxy;
    o[0] = xy.x; o[1] = xy.y;
    o[2] = zyx.x; o[3] = zyx.y; o[4] = zyx.z;
    o[5] = wwxy.x; o[6] = wwxy.y; o[7] = wwxy.z; o[8] = wwxy.w;
    const float3 rgb = v.rgb;
    o[9] = rgb.x + rgb.y * 10.0f + rgb.z * 100.0f;
    float4 w = v;
    w.xy = float2(7.0f, 8.0f);
    w.yx += float2(1.0f, 2.0f);
    w.zw *= 2.0f;
    w.wz = w.xy;
    o[10] = w.x; o[11] = w.y; o[12] = w.z; o[13] = w.w;
    float4 u = float4(v.xy, 0.5f, v.w);
    u.ba -= float2(1.0f, 3.0f);
    o[14] = u.x; o[15] = u.y; o[16] = u.z; o[17] = u.w;
    float3 c3 = float3(v.z, v.yx);
    o[18] = c3.x; o[19] = c3.y; o[20] = c3.z;
    int4 t = int4(v * 3.0f);  // conversions truncate toward zero
    o[21] = float(t.x); o[22] = float(t.w);
    o[23] = dot(v, float4(1.0f, 2.0f, 3.0f, 4.0f));
}

// The seed stores float4 partials at 8-byte-aligned addresses: vectors must not
// assume their MSL alignment when dereferenced.
kernel void unaligned(device float* p [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    device float4* q = (device float4*)(p + 2 + 8 * i);
    const float4 v = *q;
    *q = v * 2.0f + 1.0f;
    *(device float4*)(p + 6 + 8 * i) += v;
}

kernel void reinterpret(device const uint* w [[buffer(0)]], device uint* out [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
    const uint x = w[i];
    const uchar4 b = as_type<uchar4>(x);
    const char4 c = as_type<char4>(x);
    const half2 h = as_type<half2>(x);
    out[8 * i + 0] = uint(b.x) | (uint(b.w) << 8);
    out[8 * i + 1] = as_type<uint>(int(c.z));
    out[8 * i + 2] = as_type<uint>(float(h.y));
    out[8 * i + 3] = as_type<uint>(as_type<float>(x) * 2.0f);
    out[8 * i + 4] = as_type<uint4>(float4(as_type<float>(x))).z;
    out[8 * i + 5] = as_type<ushort2>(x).y;
    out[8 * i + 6] = uint(as_type<ushort>(bfloat(as_type<float>(x))));
    out[8 * i + 7] = as_type<uint>(uchar4(b.wzyx));
}
"""


@pytest.fixture(scope="module")
def vector_lib(dev):
    return compile_lib(dev, VECTOR_SRC, "vectors.metal")


def test_vector_swizzles_and_constructors(dev, vector_lib):
    v = np.array([[1.25, -2.5, 3.75, 4.5], [-0.5, 6.0, -7.25, 8.0]], np.float32)
    out = nan_floats(dev, 48)
    vector_lib.kernel("swizzles").dispatch({0: dev.buffer(v), 1: out}, threadgroups=(1,), threads=(2,))
    got = out.numpy(np.float32, (2, 24))
    for i, (x, y, z, w) in enumerate(v):
        wx, wy = 7.0 + 2.0, 8.0 + 1.0  # w.xy = (7, 8); w.yx += (1, 2)
        want = [x, y, z, y, x, w, w, x, y, x + y * 10 + z * 100,
                wx, wy, wy, wx,  # w.zw *= 2 is overwritten by w.wz = w.xy
                x, y, 0.5 - 1.0, w - 3.0, z, y, x,
                np.trunc(x * 3), np.trunc(w * 3), x + 2 * y + 3 * z + 4 * w]
        np.testing.assert_array_equal(got[i], np.array(want, np.float32))


def test_vectors_at_under_aligned_addresses(dev, vector_lib):
    p = np.arange(2 + 8 * 4 + 4, dtype=np.float32)
    buf = dev.buffer(p)
    vector_lib.kernel("unaligned").dispatch({0: buf}, threadgroups=(1,), threads=(4,))
    want = p.copy()
    for i in range(4):
        v = p[2 + 8 * i:6 + 8 * i]
        want[2 + 8 * i:6 + 8 * i] = v * 2 + 1
        want[6 + 8 * i:10 + 8 * i] += v
    np.testing.assert_array_equal(buf.numpy(np.float32), want)


def test_as_type(dev, vector_lib):
    w = np.array([0x3F800000, 0xC0490FDB, 0x807F0102, 0x7F800001], np.uint32)
    out = sentinel_words(dev, 32)
    vector_lib.kernel("reinterpret").dispatch({0: dev.buffer(w), 1: out}, threadgroups=(1,), threads=(4,))
    got = out.numpy(np.uint32, (4, 8))
    b = w.view(np.uint8).reshape(4, 4)
    f = w.view(np.float32)
    for i in range(4):
        assert got[i, 0] == int(b[i, 0]) | (int(b[i, 3]) << 8)
        assert got[i, 1] == np.uint32(np.int32(np.int8(b[i, 2])).view(np.uint32))
        assert got[i, 2] == np.float32(w[i:i + 1].view(np.float16)[1]).view(np.uint32)
        if np.isnan(f[i]):
            assert np.isnan(np.uint32(got[i, 3]).view(np.float32))
        else:
            assert got[i, 3] == (f[i] * np.float32(2)).view(np.uint32)
        assert got[i, 4] == w[i]
        assert got[i, 5] == w[i] >> 16
        assert got[i, 6] == bf16_bits(f[i:i + 1])[0]
        assert got[i, 7] == int.from_bytes(bytes(b[i][::-1]), "little")


# ---------------------------------------------------------------- half and bfloat numerics

NUMERIC_SRC = """
kernel void half_math(device const half* x [[buffer(0)]], device const half* y [[buffer(1)]],
                      device half* out [[buffer(2)]], device float* fout [[buffer(3)]],
                      uint i [[thread_position_in_grid]]) {
    const half a = x[i], b = y[i];
    out[4 * i + 0] = a * b + a;         // each operation rounds to half
    out[4 * i + 1] = a / b - b;
    const half4 v = half4(a, b, a + b, 1.0h) * 0.5h;
    out[4 * i + 2] = v.z;
    out[4 * i + 3] = half(fout[2 * i]);  // float -> half rounds to nearest even
    fout[2 * i + 1] = a * 3.0f;          // half * float is float
}

kernel void bfloat_math(device const bfloat* x [[buffer(0)]], device const bfloat* y [[buffer(1)]],
                        device bfloat* out [[buffer(2)]], device float* fout [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
    const bfloat a = x[i], b = y[i];
    out[4 * i + 0] = a * b + a;          // bfloat op bfloat rounds to bfloat
    bfloat c = a;
    c += b;
    c *= 2;                              // bfloat op int stays bfloat
    out[4 * i + 1] = c;
    out[4 * i + 2] = bfloat(fout[2 * i]); // float -> bfloat rounds to nearest even
    out[4 * i + 3] = bfloat4(a, b, a, b).w - a;
    fout[2 * i + 1] = a * 1.1f;          // bfloat op float is float, not rounded to bfloat
}
"""


@pytest.fixture(scope="module")
def numeric_lib(dev):
    return compile_lib(dev, NUMERIC_SRC, "numerics.metal")


def test_half_arithmetic_rounds_every_operation(dev, numeric_lib):
    rng = np.random.default_rng(5)
    n = 256
    x = rng.uniform(-4, 4, n).astype(np.float16)
    y = rng.uniform(0.5, 4, n).astype(np.float16)
    f = rng.uniform(-70000, 70000, n).astype(np.float32)
    f[:4] = [2049.0, 2051.0, 65520.0, 1.0 + 2.0**-11]  # ties to even, overflow, tie below 1.0
    fio = np.stack([f, np.full(n, np.nan, np.float32)], 1)
    out, fout = dev.buffer(np.full(4 * n, np.nan, np.float16)), dev.buffer(fio)
    numeric_lib.kernel("half_math").dispatch_threads(
        {0: dev.buffer(x), 1: dev.buffer(y), 2: out, 3: fout}, grid=(n,), threads=(64,))
    got = out.numpy(np.float16, (n, 4))
    np.testing.assert_array_equal(got[:, 0], x * y + x)  # numpy float16 also rounds per operation
    np.testing.assert_array_equal(got[:, 1], x / y - y)
    np.testing.assert_array_equal(got[:, 2], (x + y) * np.float16(0.5))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[:, 3], f.astype(np.float16))
    np.testing.assert_array_equal(fout.numpy(np.float32, (n, 2))[:, 1], x.astype(np.float32) * np.float32(3))


def test_bfloat_arithmetic_and_promotion(dev, numeric_lib):
    rng = np.random.default_rng(6)
    n = 256
    xb = bf16_bits(rng.uniform(-4, 4, n).astype(np.float32))
    yb = bf16_bits(rng.uniform(-4, 4, n).astype(np.float32))
    f = rng.uniform(-1e3, 1e3, n).astype(np.float32)
    f[:5] = [1.00390625, 1.01171875, 3.4e38, np.nan, -0.0]  # ties to even, overflow, NaN, -0
    fio = np.stack([f, np.full(n, np.nan, np.float32)], 1)
    out, fout = dev.buffer(np.full(4 * n, 0xFFFF, np.uint16)), dev.buffer(fio)
    numeric_lib.kernel("bfloat_math").dispatch_threads(
        {0: dev.buffer(xb), 1: dev.buffer(yb), 2: out, 3: fout}, grid=(n,), threads=(64,))
    got = out.numpy(np.uint16, (n, 4))
    a, b = bf16_to_f32(xb), bf16_to_f32(yb)
    np.testing.assert_array_equal(got[:, 0], bf16_bits(round_bf16(a * b) + a))
    np.testing.assert_array_equal(got[:, 1], bf16_bits(round_bf16(round_bf16(a + b) * np.float32(2))))
    np.testing.assert_array_equal(got[:, 2], bf16_bits(f))
    assert bf16_to_f32(got[:2, 2]).tolist() == [1.0, 1.015625]
    np.testing.assert_array_equal(got[:, 3], bf16_bits(b - a))
    np.testing.assert_array_equal(fout.numpy(np.float32, (n, 2))[:, 1], a * np.float32(1.1))


# ---------------------------------------------------------------- math functions

MATH_FUNCTIONS = {
    # name: (MSL expression of x, y, z, numpy reference over float64)
    "exp": ("exp(x)", lambda x, y, z: np.exp(x)),
    "exp2": ("exp2(x)", lambda x, y, z: np.exp2(x)),
    "log": ("log(y)", lambda x, y, z: np.log(y)),
    "rsqrt": ("rsqrt(y)", lambda x, y, z: 1 / np.sqrt(y)),
    "pow": ("pow(y, x)", lambda x, y, z: np.power(y, x)),
    "tanh": ("tanh(x)", lambda x, y, z: np.tanh(x)),
    "sin": ("sin(x)", lambda x, y, z: np.sin(x)),
    "cos": ("cos(x)", lambda x, y, z: np.cos(x)),
}
MATH_TYPES = {"float": np.float32, "half": np.float16, "bfloat": np.uint16}


def math_src(t):
    scalar = "\n".join(f"    out[{k} * n + i] = {expr};" for k, (expr, _) in enumerate(MATH_FUNCTIONS.values()))
    return f"""
kernel void math_scalar(device const {t}* xs [[buffer(0)]], device const {t}* ys [[buffer(1)]],
                        device {t}* out [[buffer(2)]], constant uint& n [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {{
    const {t} x = xs[i], y = ys[i];
{scalar}
}}
kernel void math_vector(device const {t}4* xs [[buffer(0)]], device const {t}4* ys [[buffer(1)]],
                        device {t}4* out [[buffer(2)]], constant uint& n [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {{
    const {t}4 x = xs[i], y = ys[i];
{scalar}
}}
"""


def ulp(values, t):
    """Spacing of the destination format at each reference value."""
    if t == "bfloat":
        e = np.floor(np.log2(np.maximum(np.abs(values), 2.0**-126)))
        return 2.0 ** (e - 7)
    return np.spacing(np.abs(values).astype(MATH_TYPES[t])).astype(np.float64)


@pytest.mark.parametrize("t", ["float", "half", "bfloat"])
@pytest.mark.parametrize("form", ["scalar", "vector"])
def test_math_functions_against_numpy(dev, t, form):
    rng = np.random.default_rng(9)
    n = 64
    x32 = rng.uniform(-3, 3, n).astype(np.float32)
    y32 = rng.uniform(0.1, 8, n).astype(np.float32)
    if t == "bfloat":
        xs, ys = bf16_bits(x32), bf16_bits(y32)
        x, y = bf16_to_f32(xs).astype(np.float64), bf16_to_f32(ys).astype(np.float64)
    else:
        xs, ys = x32.astype(MATH_TYPES[t]), y32.astype(MATH_TYPES[t])
        x, y = xs.astype(np.float64), ys.astype(np.float64)
    k = len(MATH_FUNCTIONS)
    out = dev.buffer(np.full(k * n, 0xFFFF, np.uint16) if t != "float" else np.full(k * n, np.nan, np.float32))
    lib = compile_lib(dev, math_src(t), f"math_{t}.metal")
    count = n if form == "scalar" else n // 4
    lib.kernel(f"math_{form}").dispatch_threads(
        {0: dev.buffer(xs), 1: dev.buffer(ys), 2: out, 3: np.uint32(count)}, grid=(count,), threads=(32,))
    raw = out.numpy(MATH_TYPES[t], (k, n))
    got = bf16_to_f32(raw).astype(np.float64) if t == "bfloat" else raw.astype(np.float64)
    for row, (name, (_, ref)) in enumerate(MATH_FUNCTIONS.items()):
        want = ref(x, y, None)
        # float: within 2 ulp (glibc's float functions are within 1, rsqrt rounds twice);
        # half/bfloat compute in float and round once: within 1 ulp of the format.
        tolerance = (2 if t == "float" else 1) * ulp(want, t)
        err = np.abs(got[row] - want)
        assert (err <= tolerance).all(), (name, np.max(err / tolerance))


FMA_SRC = """
kernel void exact_ops(device const float4* a [[buffer(0)]], device const float4* b [[buffer(1)]],
                      device const float4* c [[buffer(2)]], device float4* out [[buffer(3)]],
                      uint i [[thread_position_in_grid]]) {
    out[4 * i + 0] = fma(a[i], b[i], c[i]);
    out[4 * i + 1] = fma(a[i], b[i].x, c[i]);  // a scalar operand broadcasts
    out[4 * i + 2] = clamp(a[i], -0.5f, c[i]);
    out[4 * i + 3] = select(a[i], b[i], a[i] > c[i]);
}
"""


def test_fma_clamp_select_exact(dev):
    rng = np.random.default_rng(10)
    a, b, c = (rng.standard_normal((16, 4)).astype(np.float32) for _ in range(3))
    c = np.abs(c)
    out = nan_floats(dev, 16 * 16)
    compile_lib(dev, FMA_SRC, "exact.metal").kernel("exact_ops").dispatch(
        {0: dev.buffer(a), 1: dev.buffer(b), 2: dev.buffer(c), 3: out}, threadgroups=(1,), threads=(16,))
    got = out.numpy(np.float32, (16, 4, 4))

    def fused(p, q, r):  # exact p*q + r, rounded once to float32 (nearest, ties to even)
        exact = Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r))
        near = np.float32(float(exact))
        candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
        return min(candidates, key=lambda f: (abs(Fraction(float(f)) - exact), int(f.view(np.uint32)) & 1))

    for i in range(16):
        np.testing.assert_array_equal(got[i, 0], [fused(a[i, k], b[i, k], c[i, k]) for k in range(4)])
        np.testing.assert_array_equal(got[i, 1], [fused(a[i, k], b[i, 0], c[i, k]) for k in range(4)])
        np.testing.assert_array_equal(got[i, 2], np.minimum(np.maximum(a[i], -0.5), c[i]))
        np.testing.assert_array_equal(got[i, 3], np.where(a[i] > c[i], b[i], a[i]))


INTEGER_SRC = """
kernel void integer_ops(device const uint* x [[buffer(0)]], device uint* out [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
    const uint v = x[i];
    const uint2 pair = uint2(v, v ^ 0x5A5A5A5Au);
    out[8 * i + 0] = popcount(v);
    out[8 * i + 1] = clz(v);
    out[8 * i + 2] = ctz(v);
    out[8 * i + 3] = reverse_bits(v);
    out[8 * i + 4] = extract_bits(v, 5u, 11u);
    out[8 * i + 5] = as_type<uint>(extract_bits(int(v), 3u, 7u));
    out[8 * i + 6] = mulhi(pair, uint2(0x9E3779B9u)).y;
    out[8 * i + 7] = rotate(v, 13u);
}
"""


def test_integer_functions(dev):
    x = np.array([0, 1, 0x80000000, 0xFFFFFFFF, 0x12345678, 0x00F00000, 0xDEADBEF0, 96], np.uint32)
    out = sentinel_words(dev, 8 * len(x))
    compile_lib(dev, INTEGER_SRC, "integer.metal").kernel("integer_ops").dispatch(
        {0: dev.buffer(x), 1: out}, threadgroups=(1,), threads=(len(x),))
    got = out.numpy(np.uint32, (len(x), 8))
    for i, v in enumerate(int(u) for u in x):
        field = (v >> 3) & 0x7F
        signed = field - 0x80 if field & 0x40 else field
        want = [bin(v).count("1"), 32 - v.bit_length(), (v & -v).bit_length() - 1 if v else 32,
                int(f"{v:032b}"[::-1], 2), (v >> 5) & 0x7FF, signed & 0xFFFFFFFF,
                ((v ^ 0x5A5A5A5A) * 0x9E3779B9) >> 32, ((v << 13) | (v >> 19)) & 0xFFFFFFFF]
        np.testing.assert_array_equal(got[i], np.array(want, np.uint32), err_msg=hex(v))


# ---------------------------------------------------------------- atomics

ATOMIC_SRC = """
kernel void counters(device atomic_uint* count [[buffer(0)]], device atomic_int* extremes [[buffer(1)]],
                     device atomic_float* total [[buffer(2)]], device uint* per_group [[buffer(3)]],
                     device uint* tickets [[buffer(4)]],
                     uint gid [[thread_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                     uint group [[threadgroup_position_in_grid]]) {
    threadgroup atomic_uint local;
    if (tid == 0) atomic_store_explicit(&local, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    tickets[gid] = atomic_fetch_add_explicit(&count[0], 1u, memory_order_relaxed);
    atomic_fetch_max_explicit(&extremes[0], int(gid) - 1000, memory_order_relaxed);
    atomic_fetch_min_explicit(&extremes[1], 1000 - int(gid), memory_order_relaxed);
    atomic_fetch_add_explicit(total, float(gid % 7), memory_order_relaxed);
    atomic_fetch_add_explicit(&local, tid + 1, memory_order_relaxed);
    uint seen = atomic_load_explicit(&count[1], memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&count[1], &seen, seen + 2u, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) per_group[group] = atomic_load_explicit(&local, memory_order_relaxed);
}
"""


def test_atomics_on_device_and_threadgroup_memory(dev):
    groups_, threads = 96, 64
    n = groups_ * threads
    count = dev.buffer(np.zeros(2, np.uint32))
    extremes = dev.buffer(np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max], np.int32))
    total = dev.buffer(np.zeros(1, np.float32))
    per_group, tickets = sentinel_words(dev, groups_), sentinel_words(dev, n)
    compile_lib(dev, ATOMIC_SRC, "atomics.metal").kernel("counters").dispatch(
        {0: count, 1: extremes, 2: total, 3: per_group, 4: tickets}, threadgroups=(groups_,), threads=(threads,))
    np.testing.assert_array_equal(count.numpy(np.uint32), [n, 2 * n])
    np.testing.assert_array_equal(extremes.numpy(np.int32), [n - 1 - 1000, 1000 - (n - 1)])
    assert total.numpy(np.float32)[0] == float(np.sum(np.arange(n) % 7))  # small integers: exact in any order
    np.testing.assert_array_equal(per_group.numpy(np.uint32), np.full(groups_, threads * (threads + 1) // 2))
    np.testing.assert_array_equal(np.sort(tickets.numpy(np.uint32)), np.arange(n))  # every ticket exactly once
