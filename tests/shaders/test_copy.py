"""shaders/copy.metal: strided row copies and fills of 32-bit elements.

Copies are exact bit moves (NaN payloads, -0.0 and denormals included) and fills
write the given bit pattern; every element outside the addressed rectangle must keep
its previous contents. Grids larger than the rectangle check the edge guards.
"""

import numpy as np
import pytest

COPY_PARAMS = np.dtype([(n, "<u4") for n in ("cols", "rows", "src_offset", "src_stride", "dst_offset", "dst_stride")])
FILL_PARAMS = np.dtype([(n, "<u4") for n in ("cols", "rows", "dst_offset", "dst_stride", "value_bits")])
SENTINEL = 0xDEADBEEF


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("copy.metal")


def odd_bits(rng, n):
    """uint32 words covering special floats: quiet/signalling NaN payloads, +-0, inf, denormals."""
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0x7FC00001, 0x7F800001, 0xFFC12345, 0x80000000, 0x00000000, 0x7F800000, 0x00000001,
                         0x807FFFFF], np.uint32)
    words[:specials.size] = specials[:n]
    return words


@pytest.mark.parametrize("name", ["copy_f32", "copy_u32"])
@pytest.mark.parametrize("cols,rows", [(1, 1), (7, 3), (33, 2), (129, 1), (10240, 2)])
def test_copy_rows(dev, lib, name, cols, rows):
    rng = np.random.default_rng(cols * 31 + rows)
    src_offset, src_stride = 5, cols + 3
    dst_offset, dst_stride = 2, cols + 9
    src = odd_bits(rng, src_offset + rows * src_stride)
    dst_init = np.full(dst_offset + rows * dst_stride + 4, SENTINEL, np.uint32)
    dst = dev.buffer(dst_init)
    params = np.array([(cols, rows, src_offset, src_stride, dst_offset, dst_stride)], COPY_PARAMS)
    # dispatchThreads over a larger grid: the guards must stop the extra threads.
    lib.kernel(name).dispatch_threads({0: dev.buffer(src), 1: dst, 2: params}, grid=(cols + 5, rows + 2),
                                      threads=(32, 2))
    want = dst_init.copy()
    for r in range(rows):
        want[dst_offset + r * dst_stride:dst_offset + r * dst_stride + cols] = \
            src[src_offset + r * src_stride:src_offset + r * src_stride + cols]
    np.testing.assert_array_equal(dst.numpy(np.uint32), want)


@pytest.mark.parametrize("name,value_bits", [("fill_f32", 0x00000000), ("fill_f32", 0x80000000),
                                             ("fill_f32", 0x7FC00001), ("fill_f32", 0x3F800000),
                                             ("fill_u32", 0xFFFFFFFF), ("fill_u32", 7)])
@pytest.mark.parametrize("cols,rows", [(1, 1), (33, 3), (1000, 2)])
def test_fill_rows(dev, lib, name, value_bits, cols, rows):
    dst_offset, dst_stride = 3, cols + 2
    dst_init = np.full(dst_offset + rows * dst_stride + 4, SENTINEL, np.uint32)
    dst = dev.buffer(dst_init)
    params = np.array([(cols, rows, dst_offset, dst_stride, value_bits)], FILL_PARAMS)
    # threadgroups covering more than the rectangle (edge guards)
    lib.kernel(name).dispatch({0: dst, 1: params}, threadgroups=(-(-cols // 64) + 1, rows + 1), threads=(64, 1))
    want = dst_init.copy()
    for r in range(rows):
        want[dst_offset + r * dst_stride:dst_offset + r * dst_stride + cols] = value_bits
    np.testing.assert_array_equal(dst.numpy(np.uint32), want)
