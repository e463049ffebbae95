"""The CPU runtime: MSL translation, GPU execution semantics, and the limits it enforces like a GPU."""

import time

import numpy as np
import pytest

from metalqwen import gpu

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"


@pytest.fixture(scope="module")
def cpu():
    return gpu.Device("cpu")


def build(dev, body, name="test.metal"):
    return dev.compile(HEADER + body, name)


def nan_buffer(dev, count, dtype=np.float32):
    return dev.buffer(np.full(count, np.nan, dtype))


# ---------------------------------------------------------------- dispatch and builtins


def test_position_builtins_3d_with_partial_edge_groups(cpu):
    lib = build(cpu, """
kernel void ids(device uint* out [[buffer(0)]],
                uint3 gid [[thread_position_in_grid]],
                uint3 lid [[thread_position_in_threadgroup]],
                uint3 tg [[threadgroup_position_in_grid]],
                uint3 tpg [[threads_per_threadgroup]],
                uint3 grid [[threads_per_grid]],
                uint tidx [[thread_index_in_threadgroup]],
                ushort lane [[thread_index_in_simdgroup]],
                uint sg [[simdgroup_index_in_threadgroup]]) {
    uint i = (gid.z * grid.y + gid.y) * grid.x + gid.x;
    device uint* o = out + i * 12;
    o[0] = lid.x; o[1] = lid.y; o[2] = lid.z;
    o[3] = tg.x; o[4] = tg.y; o[5] = tg.z;
    o[6] = tpg.x; o[7] = tpg.y; o[8] = tpg.z;
    o[9] = tidx; o[10] = lane; o[11] = sg;
}
""")
    grid, tpg = (10, 5, 3), (4, 4, 2)
    out = cpu.empty(int(np.prod(grid)) * 12 * 4)
    lib.kernel("ids").dispatch_threads({0: out}, grid=grid, threads=tpg)
    got = out.numpy(np.uint32, (grid[2], grid[1], grid[0], 12))
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                g = (x // tpg[0], y // tpg[1], z // tpg[2])
                size = tuple(min(t, n - gi * t) for t, n, gi in zip(tpg, grid, g))
                local = (x % tpg[0], y % tpg[1], z % tpg[2])
                tidx = local[0] + size[0] * (local[1] + size[1] * local[2])
                want = [*local, *g, *size, tidx, tidx % 32, tidx // 32]
                assert list(got[z, y, x]) == want, (x, y, z)


def test_buffer_offsets_and_set_bytes_structs(cpu):
    lib = build(cpu, """
struct Params { uint n; float scale; float bias; };
kernel void affine(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                   constant Params& p [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i < p.n) y[i] = x[i] * p.scale + p.bias;
}
""")
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    xb = cpu.buffer(np.concatenate([np.zeros(16, np.float32), x]))
    y = nan_buffer(cpu, 64)
    params = np.array([(50, 2.0, 0.5)], dtype=[("n", "<u4"), ("scale", "<f4"), ("bias", "<f4")])
    lib.kernel("affine").dispatch_threads({0: (xb, 64), 1: y, 2: params}, grid=(64,), threads=(32,))
    got = y.numpy(np.float32)
    np.testing.assert_array_equal(got[:50], x[:50] * np.float32(2) + np.float32(0.5))
    assert np.isnan(got[50:]).all()


def test_new_buffers_read_as_nan(cpu):
    assert np.isnan(cpu.empty(64).numpy(np.float32)).all()


# ---------------------------------------------------------------- threadgroup memory and barriers


def test_threadgroup_memory_is_shared_per_group_and_synchronised_by_barriers(cpu):
    lib = build(cpu, """
kernel void reverse_in_group(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                             uint i [[thread_position_in_grid]], uint t [[thread_index_in_threadgroup]],
                             uint n [[threads_per_threadgroup]]) {
    threadgroup float tile[256];
    tile[t] = x[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[i] = tile[n - 1 - t];
}
""")
    x = np.arange(1024, dtype=np.float32)
    y = nan_buffer(cpu, 1024)
    lib.kernel("reverse_in_group").dispatch({0: cpu.buffer(x), 1: y}, threadgroups=(4,), threads=(256,))
    np.testing.assert_array_equal(y.numpy(np.float32), x.reshape(4, 256)[:, ::-1].reshape(-1))


def test_threadgroup_memory_starts_as_nan_in_every_group(cpu):
    lib = build(cpu, """
kernel void leak(device float* y [[buffer(0)]], uint g [[threadgroup_position_in_grid]],
                 uint t [[thread_index_in_threadgroup]]) {
    threadgroup float scratch[64];
    y[g * 64 + t] = scratch[t];          // unwritten: must not see zeros or an earlier group's data
    threadgroup_barrier(mem_flags::mem_threadgroup);
    scratch[t] = float(g);
}
""")
    y = cpu.buffer(np.zeros(64 * 8, np.float32))
    lib.kernel("leak").dispatch({0: y}, threadgroups=(8,), threads=(64,))
    assert np.isnan(y.numpy(np.float32)).all()


def test_threadgroup_argument_memory(cpu):
    lib = build(cpu, """
kernel void via_arg(device float* y [[buffer(0)]], threadgroup float* shared [[threadgroup(0)]],
                    uint t [[thread_index_in_threadgroup]]) {
    shared[t] = float(t) * 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = shared[31 - t];
}
""")
    y = nan_buffer(cpu, 32)
    cb = cpu.command_buffer()
    cb._native.set_threadgroup_memory(0, 32 * 4)
    cb.dispatch(lib.kernel("via_arg"), {0: y}, threadgroups=(1,), threads=(32,))
    cb.commit()
    cb.wait()
    np.testing.assert_array_equal(y.numpy(np.float32), (31 - np.arange(32)) * 2.0)


def test_gpu_seconds_time_the_execution_after_wait(cpu):
    lib = build(cpu, """
kernel void spin(device float* y [[buffer(0)]], uint t [[thread_position_in_grid]]) {
    float a = float(t);
    for (int i = 0; i < 20000; ++i) a = a * 0.999f + 1.0f;
    y[t] = a;
}
""")
    y = nan_buffer(cpu, 256)
    cb = cpu.command_buffer()
    with pytest.raises(gpu.GpuError, match="not committed"):
        cb.gpu_seconds()
    for _ in range(4):
        cb.dispatch(lib.kernel("spin"), {0: y}, threadgroups=(4,), threads=(64,))
    start = time.perf_counter()
    cb.commit()
    cb.wait()
    assert 0 < cb.gpu_seconds() <= time.perf_counter() - start


def test_reports_a_fixed_gpu_core_count(cpu):
    """Work split by core count (decode attention splits) comes out the same on every host."""
    assert cpu.gpu_cores == 10


def test_refuses_more_than_32k_of_threadgroup_memory(cpu):
    lib = build(cpu, """
kernel void big(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    threadgroup float a[8192];
    threadgroup float b[16];
    a[t] = 1.0f; b[t % 16] = 2.0f;
    y[t] = a[t] + b[t % 16];
}
""")
    with pytest.raises(gpu.GpuError, match=r"kernel 'big'.*threadgroup memory of \d+ bytes exceeds the limit of 32768"):
        lib.kernel("big").dispatch({0: cpu.empty(128)}, threadgroups=(1,), threads=(32,))


def test_refuses_barriers_reached_at_different_places(cpu):
    lib = build(cpu, """
kernel void split(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    if (t < 32) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    y[t] = 1.0f;
}
""", name="split.metal")
    with pytest.raises(gpu.GpuError, match=r"different threadgroup_barriers: split\.metal:6 .* split\.metal:8"):
        lib.kernel("split").dispatch({0: cpu.empty(256)}, threadgroups=(1,), threads=(64,))


# ---------------------------------------------------------------- SIMD-group collectives


def test_refuses_a_collective_reached_by_part_of_a_simdgroup(cpu):
    lib = build(cpu, """
kernel void partial(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    float v = 1.0f;
    if (lane < 16) {
        v = simd_sum(v);
    }
    y[lane] = simd_max(v);
}
""", name="partial.metal")
    with pytest.raises(gpu.GpuError, match=r"lanes diverged.*partial\.metal:7.*partial\.metal:9"):
        lib.kernel("partial").dispatch({0: cpu.empty(128)}, threadgroups=(1,), threads=(32,))


def test_refuses_a_collective_while_other_lanes_wait_at_a_barrier(cpu):
    lib = build(cpu, """
kernel void mixed(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    float v = 1.0f;
    if (lane == 0) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
        v = simd_sum(v);
    }
    y[lane] = v;
}
""", name="mixed.metal")
    with pytest.raises(gpu.GpuError, match=r"mixed\.metal:9 was reached by only part of the SIMD-group.*mixed\.metal:7"):
        lib.kernel("mixed").dispatch({0: cpu.empty(128)}, threadgroups=(1,), threads=(32,))


def test_collectives_skip_lanes_that_returned(cpu):
    lib = build(cpu, """
kernel void early_exit(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    if (lane >= 20) return;
    y[lane] = simd_sum(float(lane));
}
""")
    y = nan_buffer(cpu, 32)
    lib.kernel("early_exit").dispatch({0: y}, threadgroups=(1,), threads=(32,))
    got = y.numpy(np.float32)
    np.testing.assert_array_equal(got[:20], np.full(20, sum(range(20)), np.float32))
    assert np.isnan(got[20:]).all()


# ---------------------------------------------------------------- command buffers


def test_dispatches_without_a_barrier_may_run_in_any_order(cpu):
    lib = build(cpu, """
kernel void write_value(device float* x [[buffer(0)]], constant float& v [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) { x[i] = v; }
kernel void copy_values(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) { y[i] = x[i]; }
""")
    write, copy = lib.kernel("write_value"), lib.kernel("copy_values")

    def run(with_barrier):
        x, y = cpu.buffer(np.zeros(32, np.float32)), nan_buffer(cpu, 32)
        cb = cpu.command_buffer()
        cb.dispatch(write, {0: x, 1: np.float32(7)}, threadgroups=(1,), threads=(32,))
        if with_barrier:
            cb.barrier()
        cb.dispatch(copy, {0: x, 1: y}, threadgroups=(1,), threads=(32,))
        cb.commit()
        cb.wait()
        return y.numpy(np.float32)

    np.testing.assert_array_equal(run(True), np.full(32, 7, np.float32))
    # The CPU runtime runs barrier-free neighbours last-first, so a forgotten barrier shows.
    np.testing.assert_array_equal(run(False), np.zeros(32, np.float32))


def test_committed_command_buffer_is_sealed(cpu):
    cb = cpu.command_buffer()
    cb.commit()
    cb.wait()
    with pytest.raises(gpu.GpuError, match="already committed"):
        cb.barrier()


# ---------------------------------------------------------------- limits and argument checks


def test_refuses_too_many_threads_and_respects_the_kernel_maximum(cpu):
    lib = build(cpu, """
[[max_total_threads_per_threadgroup(64)]]
kernel void small(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 0.0f; }
kernel void plain(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 0.0f; }
""")
    small, plain = lib.kernel("small"), lib.kernel("plain")
    assert small.max_threads_per_threadgroup == 64
    assert plain.max_threads_per_threadgroup == 1024
    y = cpu.empty(8192)
    with pytest.raises(gpu.GpuError, match=r"kernel 'small': 128 threads per threadgroup exceed its maximum of 64"):
        small.dispatch({0: y}, threadgroups=(1,), threads=(128,))
    with pytest.raises(gpu.GpuError, match=r"kernel 'plain': 2048 threads per threadgroup exceed its maximum of 1024"):
        plain.dispatch({0: y}, threadgroups=(1,), threads=(2048,))


def test_template_kernel_maximum_applies_to_its_instantiations(cpu):
    lib = build(cpu, """
template <int N>
[[max_total_threads_per_threadgroup(64)]]
kernel void fill(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = float(N); }
#define FILL_ARGS device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]
template [[host_name("fill_1")]] kernel void fill<1>(FILL_ARGS);
template [[host_name("fill_2")]] [[max_total_threads_per_threadgroup(32)]] kernel void fill<2>(FILL_ARGS);
template <int N>
kernel void plain(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = float(N); }
template [[host_name("plain_1")]] kernel void plain<1>(FILL_ARGS);
""")
    assert lib.kernel("fill_1").max_threads_per_threadgroup == 64  # inherited from the definition
    assert lib.kernel("fill_2").max_threads_per_threadgroup == 32  # its own
    assert lib.kernel("plain_1").max_threads_per_threadgroup == 1024


def test_refuses_set_bytes_over_4k_and_short_arguments(cpu):
    lib = build(cpu, """
struct Big { float v[8]; };
kernel void take(device float* y [[buffer(0)]], constant Big& b [[buffer(1)]]) { y[0] = b.v[7]; }
""")
    k = lib.kernel("take")
    y = cpu.empty(4)
    with pytest.raises(gpu.GpuError, match=r"exceed the limit of 4096; use a buffer \(kernel 'take'\)"):
        k.dispatch({0: y, 1: np.zeros(1025, np.float32)}, threadgroups=(1,), threads=(1,))
    with pytest.raises(gpu.GpuError, match=r"argument 'b' \[\[buffer\(1\)\]\] needs 32 bytes, 16 are bound"):
        k.dispatch({0: y, 1: np.zeros(4, np.float32)}, threadgroups=(1,), threads=(1,))
    with pytest.raises(gpu.GpuError, match=r"argument 'b' \[\[buffer\(1\)\]\] is not bound"):
        k.dispatch({0: y}, threadgroups=(1,), threads=(1,))


def test_python_argument_errors(cpu):
    k = build(cpu, "kernel void nop(device float* y [[buffer(0)]]) { y[0] = 1.0f; }").kernel("nop")
    y = cpu.empty(4)
    with pytest.raises(ValueError, match="argument index"):
        k.dispatch({31: y}, threadgroups=(1,), threads=(1,))
    with pytest.raises(TypeError, match="expected Buffer"):
        k.dispatch({0: [1, 2]}, threadgroups=(1,), threads=(1,))
    with pytest.raises(TypeError, match=r"\(Buffer, byte offset\)"):
        k.dispatch({0: (y, "x")}, threadgroups=(1,), threads=(1,))
    with pytest.raises(ValueError, match="threads must be 1 to 3 positive integers"):
        k.dispatch({0: y}, threadgroups=(1,), threads=(0,))
    with pytest.raises(ValueError, match="threadgroups must be 1 to 3"):
        k.dispatch({0: y}, threadgroups=(1, 1, 1, 1), threads=(1,))
    with pytest.raises(gpu.GpuError, match="offset 8 is past the end of a 4-byte buffer"):
        k.dispatch({0: (y, 8)}, threadgroups=(1,), threads=(1,))


# ---------------------------------------------------------------- compilation


def test_compile_errors_point_at_the_msl_line(cpu):
    with pytest.raises(gpu.CompileError) as info:
        build(cpu, "kernel void broken(device float* y [[buffer(0)]]) {\n    y[0] = undefined_name;\n}\n",
              name="broken.metal")
    assert "broken.metal:4" in info.value.diagnostics
    assert "undefined_name" in info.value.diagnostics


def test_missing_kernel_and_unsupported_attributes_are_named(cpu):
    lib = build(cpu, "kernel void one(device float* y [[buffer(0)]]) { y[0] = 1.0f; }")
    with pytest.raises(gpu.GpuError, match="no kernel function 'two'"):
        lib.kernel("two")
    with pytest.raises(gpu.CompileError, match=r"kernel 'k'.*\[\[stage_in\]\] of 'v' is not supported"):
        build(cpu, "kernel void k(float4 v [[stage_in]]) {}")
    with pytest.raises(gpu.CompileError, match="parameter 'device float\\* y' has no \\[\\[attribute\\]\\]"):
        build(cpu, "kernel void k(device float* y) {}")


def test_half_literals_and_swizzles_translate(cpu):
    lib = build(cpu, """
kernel void lit(device float* y [[buffer(0)]]) {
    half a = 1.5h;
    half b = .25H;
    float4 v = float4(1.0f, 2.0f, 3.0f, 4.0f);
    float2 w = v.wx;          // read swizzle
    v.yz = float2(a, b);      // write swizzle
    v.xw += w;
    y[0] = v.x; y[1] = v.y; y[2] = v.z; y[3] = v.w;
}
""")
    y = nan_buffer(cpu, 4)
    lib.kernel("lit").dispatch({0: y}, threadgroups=(1,), threads=(1,))
    np.testing.assert_array_equal(y.numpy(np.float32), [5.0, 1.5, 0.25, 5.0])


def test_templated_kernels_instantiate_under_their_host_names(cpu):
    lib = build(cpu, """
template <typename T, int SCALE>
[[kernel]] void scale_into(device const T* x [[buffer(0)]], device float* y [[buffer(1)]],
                           uint i [[thread_position_in_grid]]) {
    y[i] = float(x[i]) * SCALE;
}
template [[host_name("scale_float_2")]] [[kernel]] void scale_into<float, 2>(
    device const float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_position_in_grid]]);
template [[host_name("scale_half_3")]] kernel void scale_into<half, 3>(
    device const half* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_position_in_grid]]);
""")
    x = np.arange(8, dtype=np.float32)
    for name, data, factor in [("scale_float_2", x, 2), ("scale_half_3", x.astype(np.float16), 3)]:
        y = nan_buffer(cpu, 8)
        lib.kernel(name).dispatch({0: cpu.buffer(data), 1: y}, threadgroups=(1,), threads=(8,))
        np.testing.assert_array_equal(y.numpy(np.float32), x * factor)
    with pytest.raises(gpu.GpuError, match="no kernel function 'scale_into'"):
        lib.kernel("scale_into")


def test_threadgroup_array_sizes_may_be_expressions(cpu):
    lib = build(cpu, """
constant constexpr uint N = 32;
kernel void sizes(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    threadgroup float a[2 * N];
    threadgroup float b[(N + N) / 2][2];
    a[t] = float(t);
    b[t % N][t / N] = float(t) * 10.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = a[63 - t] + b[(63 - t) % N][(63 - t) / N];
}
""")
    y = nan_buffer(cpu, 64)
    lib.kernel("sizes").dispatch({0: y}, threadgroups=(1,), threads=(64,))
    np.testing.assert_array_equal(y.numpy(np.float32), (63 - np.arange(64)) * 11.0)


def test_refuses_several_threadgroup_variables_in_one_statement(cpu):
    with pytest.raises(gpu.CompileError, match="one threadgroup variable per statement"):
        build(cpu, "kernel void two(device float* y [[buffer(0)]]) { threadgroup float a[4], b[4]; y[0] = a[0] + b[0]; }")


# ---------------------------------------------------------------- the C preprocessor runs first


def test_macro_generated_instantiations_with_stringised_host_names(cpu):
    # MLX-style instantiation macros: host names passed in, or stringised and concatenated.
    lib = build(cpu, """
template <int N, int M>
[[kernel]] void fill(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = N * 100 + M; }
#define INST(NAME, N) \\
    template [[host_name(NAME)]] [[kernel]] void fill<N, 0>(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]);
INST("fill_1", 1)
INST("fill_2", 2)
#define INST_QMV(B, G) \\
    template [[host_name("qmv_b" #B "_g" #G)]] [[kernel]] void fill<B, G>( \\
        device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]);
INST_QMV(4, 64)
INST_QMV(8, 32)
""")
    for name, value in [("fill_1", 100), ("fill_2", 200), ("qmv_b4_g64", 464), ("qmv_b8_g32", 832)]:
        y = nan_buffer(cpu, 4)
        lib.kernel(name).dispatch({0: y}, threadgroups=(1,), threads=(4,))
        np.testing.assert_array_equal(y.numpy(np.float32), np.full(4, value, np.float32))


def test_decltype_instances_take_their_templates_signature(cpu):
    # MLX's instantiate_kernel: the instance names no parameter; the translator binds the
    # template's, typed as in the instance (dependent pointee types, constant references).
    lib = build(cpu, """
struct Wide { typedef float elem; };
struct Narrow { typedef half elem; };
struct Scale { float factor; uint offset; };
template <typename F, int N>
[[max_total_threads_per_threadgroup(64)]]
[[kernel]] void scaled(device const typename F::elem* x [[buffer(0)]], device float* y [[buffer(1)]],
                       constant Scale& s [[buffer(2)]], ushort i [[thread_position_in_grid]]) {
    y[i] = float(x[i + s.offset]) * s.factor + N;
}
#define instantiate_kernel(name, func, ...) \\
    template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;
#define INSTANCES(F, T) instantiate_kernel("scaled_" #F "_1", scaled, T, 1) instantiate_kernel("scaled_" #F "_2", scaled, T, 2)
INSTANCES(f32, Wide)
INSTANCES(f16, Narrow)
""")
    x = np.arange(12, dtype=np.float32)
    scale = np.array([np.float32(3.0).view(np.uint32), 2], np.uint32)  # Scale{factor 3, offset 2}
    for name, data, n in [("scaled_f32_1", x, 1), ("scaled_f32_2", x, 2), ("scaled_f16_1", x.astype(np.float16), 1),
                          ("scaled_f16_2", x.astype(np.float16), 2)]:
        kernel = lib.kernel(name)
        assert kernel.max_threads_per_threadgroup == 64  # the template's
        y = nan_buffer(cpu, 8)
        kernel.dispatch({0: cpu.buffer(data), 1: y, 2: scale}, threadgroups=(1,), threads=(8,))
        np.testing.assert_array_equal(y.numpy(np.float32), x[2:10] * 3 + n)


def test_refuses_a_decltype_instance_without_its_template(cpu):
    # `plain` is a function template, not a kernel template: no parameters to bind.
    with pytest.raises(gpu.CompileError, match="kernel instance of 'plain' has no kernel template defined before it"):
        build(cpu, """
template <int N> void plain(device float* y, uint i) { y[i] = N; }
template [[host_name("plain_1")]] [[kernel]] decltype(plain<1>) plain<1>;
""")


def test_macros_in_parameter_lists_and_kernel_definitions(cpu):
    lib = build(cpu, """
#define BINARY_ARGS device const float* a [[buffer(0)]], device const float* b [[buffer(1)]], \\
                    device float* out [[buffer(2)]], uint i [[thread_position_in_grid]]
#define BINARY(NAME, EXPR) kernel void NAME(BINARY_ARGS) { out[i] = EXPR; }
BINARY(add, a[i] + b[i])
BINARY(mul, a[i] * b[i])
kernel void sub(BINARY_ARGS) { out[i] = a[i] - b[i]; }
""")
    a, b = np.arange(8, dtype=np.float32), np.full(8, 3, np.float32)
    for name, want in [("add", a + b), ("mul", a * b), ("sub", a - b)]:
        out = nan_buffer(cpu, 8)
        lib.kernel(name).dispatch({0: cpu.buffer(a), 1: cpu.buffer(b), 2: out}, threadgroups=(1,), threads=(8,))
        np.testing.assert_array_equal(out.numpy(np.float32), want)


def test_threadgroup_array_declared_through_a_macro(cpu):
    lib = build(cpu, """
#define TILE 64
#define SHARED(T, NAME, N) threadgroup T NAME[N]
kernel void rev(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    SHARED(float, tile, TILE);
    tile[t] = float(t);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = tile[TILE - 1 - t];
}
""")
    y = nan_buffer(cpu, 64)
    lib.kernel("rev").dispatch({0: y}, threadgroups=(1,), threads=(64,))
    np.testing.assert_array_equal(y.numpy(np.float32), 63 - np.arange(64, dtype=np.float32))


def test_metal_header_macros_and_version_reach_the_kernel(cpu):
    # Metal's own macros (INFINITY, M_PI_F, FLT_MAX) survive preprocessing for the real
    # compile; __METAL_VERSION__ is defined while conditionals are decided.
    lib = build(cpu, """
#if defined(__METAL_VERSION__) && __METAL_VERSION__ >= 310
#define VERSION_OK 1.0f
#else
#define VERSION_OK 0.0f
#endif
kernel void consts(device float* y [[buffer(0)]]) {
    y[0] = M_PI_F; y[1] = INFINITY; y[2] = FLT_MAX; y[3] = VERSION_OK; y[4] = __METAL_VERSION__;
}
""")
    y = nan_buffer(cpu, 5)
    lib.kernel("consts").dispatch({0: y}, threadgroups=(1,), threads=(1,))
    want = np.array([np.pi, np.inf, np.finfo(np.float32).max, 1, 310], np.float32)
    np.testing.assert_array_equal(y.numpy(np.float32), want)


def test_compile_error_inside_a_macro_expansion_names_the_metal_line(cpu):
    with pytest.raises(gpu.CompileError) as info:
        build(cpu, """
#define STORE(V) \\
    y[0] = V + undefined_in_macro;
kernel void broken(device float* y [[buffer(0)]]) {
    STORE(1.0f)
}
""", name="macro_error.metal")
    assert "macro_error.metal:7" in info.value.diagnostics  # the STORE(...) line (HEADER adds two)
    assert "undefined_in_macro" in info.value.diagnostics


def test_preprocessor_errors_are_compile_errors(cpu):
    with pytest.raises(gpu.CompileError, match="preprocessing failed") as info:
        build(cpu, "#error unsupported configuration\nkernel void k(device float* y [[buffer(0)]]) {}\n",
              name="err.metal")
    assert "err.metal:3" in info.value.diagnostics
    assert "unsupported configuration" in info.value.diagnostics
    with pytest.raises(gpu.CompileError, match="preprocessing failed") as info:
        build(cpu, '#include "no_such_header.h"\n', name="inc.metal")
    assert "no_such_header.h" in info.value.diagnostics


def test_runtime_errors_inside_macro_expansions_name_the_invocation_line(cpu):
    lib = build(cpu, """
#define SYNC threadgroup_barrier(mem_flags::mem_threadgroup)
kernel void split(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    if (t < 32) {
        SYNC;
    } else {
        SYNC;
    }
    y[t] = 1.0f;
}
""", name="msplit.metal")
    with pytest.raises(gpu.GpuError, match=r"different threadgroup_barriers: msplit\.metal:7 .* msplit\.metal:9"):
        lib.kernel("split").dispatch({0: cpu.empty(256)}, threadgroups=(1,), threads=(64,))


def test_line_directives_and_names_with_spaces_keep_their_lines(cpu):
    lib = build(cpu, """
#line 40 "other file.metal"
kernel void split(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    if (t < 32) threadgroup_barrier(mem_flags::mem_threadgroup);
    else threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = 1.0f;
}
""", name="my kernels.metal")
    with pytest.raises(gpu.GpuError, match=r"other file\.metal:41 .* other file\.metal:42"):
        lib.kernel("split").dispatch({0: cpu.empty(256)}, threadgroups=(1,), threads=(64,))


def test_seed_library_compiles_unchanged(cpu):
    import os
    import re
    from pathlib import Path

    # Another engine's library, not part of this repository (docs/testing.md, "The seed kernel library").
    if not os.environ.get("METALQWEN_SEED_METAL"):
        pytest.skip("METALQWEN_SEED_METAL is unset: the seed kernel library is not part of "
                    "the repository (docs/testing.md)")
    seed = Path(os.environ["METALQWEN_SEED_METAL"])
    lib = cpu.compile(seed.read_text(), "forward.metal")
    names = re.findall(r"^\s*(?:\[\[kernel\]\]|kernel)\s+void\s+(\w+)", seed.read_text(), re.M)
    assert names
    for name in names:
        assert lib.kernel(name).name == name


# ---------------------------------------------------------------- the kernel cache across processes


def test_processes_compiling_one_source_build_it_once(tmp_path):
    # Two processes on a cold cache (test workers, CI passes): the second waits on the first's
    # file lock and finds the object built. The compiler wrapper logs each object build.
    import os
    import subprocess
    import sys

    log = tmp_path / "builds.log"
    wrapper = tmp_path / "cxx"
    wrapper.write_text('#!/bin/sh\ncase "$*" in *-shared*) echo build >> "$MQ_BUILD_LOG"; sleep 2;; esac\n'
                       'exec c++ "$@"\n')
    wrapper.chmod(0o755)
    source = "kernel void once(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 7.0f; }"
    code = f"from metalqwen import gpu; gpu.Device('cpu').compile({source!r}, 'once.metal').kernel('once')"
    env = dict(os.environ, METALQWEN_CXX=str(wrapper), METALQWEN_CACHE_DIR=str(tmp_path / "cache"),
               METALQWEN_CHECK_MSL="0", MQ_BUILD_LOG=str(log))
    workers = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    assert log.read_text().split() == ["build"]
