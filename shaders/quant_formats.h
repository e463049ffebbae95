// Weight formats of the projection kernels (quant.h), one struct per format: how to
// load one block of MQ_QUANT_BLOCK consecutive weights of a row and what they are worth.
// Included by every kernel family that streams projection weights, so a new family
// (e.g. gathered expert matvecs) reuses the same block math.
//
// A row of in_dim weights is in_dim / MQ_QUANT_BLOCK blocks of Fmt::WORDS uint32 words,
// stored back to back: block k of row r starts at word (r * blocks_per_row + k) * WORDS.
// Every format provides:
//   scale_t                 element type of the scales/biases buffers (unused by floats)
//   WORDS                   uint32 words of one block
//   Block                   one block in registers: its words plus the scale(s)/bias it needs
//   load(w, s, b, row, k, blocks_per_row)   block k of `row`
//   value(blk, j)           weight j of the block before its scale and bias (code value)
//   dot(blk, x, xsum, acc)  acc + sum_j w_j x[j] for the block's 32 x values (x[0..8) float4s,
//                           xsum = their sum), in a fixed order: qmv and qmv_rows share it,
//                           which keeps a verify row bit-identical to decode
//   dequant(blk, out)       out[j] = w_j (float) for j < MQ_QUANT_BLOCK
// Codes are exact small numbers in float, so dot's only roundings are its f32 fma chain
// and the scale/bias terms.
#pragma once

constant constexpr uint QBLOCK = MQ_QUANT_BLOCK;

// Code j (BITS wide) of a little-endian bit stream held in words w: element 0 in the lowest
// bits of word 0; a code may straddle two words (3, 5, 6 bits). MLX packs affine codes so.
template <int BITS>
inline uint stream_code(thread const uint* w, uint j) {
  const uint bit = BITS * j, word = bit / 32, shift = bit % 32;
  uint v = w[word] >> shift;
  if (shift + BITS > 32) v |= w[word + 1] << (32 - shift);
  return v & ((1u << BITS) - 1u);
}

// FP4 E2M1 (sign, 2 exponent bits, 1 mantissa bit): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
inline float e2m1_value(uint c) {
  const uint e = (c >> 1) & 3u, m = c & 1u;
  const uint twice = e == 0 ? m : (2u + m) << (e - 1);  // 2 x magnitude, exact
  const float v = float(twice) * 0.5f;
  return (c & 8u) ? -v : v;
}

// FP8 E4M3 (OCP "fn": bias 7, no infinities, S.1111.111 is NaN).
inline float e4m3_value(uint c) {
  const uint e = (c >> 3) & 15u, m = c & 7u;
  float v;
  if (e == 0) v = float(m) * 0.001953125f;  // subnormal: m * 2^-9
  else if (e == 15 && m == 7) v = NAN;
  else v = as_type<float>(((e + 120u) << 23) | (m << 20));
  return (c & 128u) ? -v : v;
}

// E8M0 scale: 2^(c - 127); 255 is NaN.
inline float e8m0_value(uint c) {
  if (c == 0) return as_type<float>(0x00400000u);  // 2^-127, a float subnormal
  if (c == 255) return NAN;
  return as_type<float>(c << 23);
}

template <int WORDS>
inline void load_words(device const uint* src, thread uint* dst) {
  for (int i = 0; i < WORDS; i++) dst[i] = src[i];
}

// sum_j Fmt::value(blk, j) * x[j] over j in [4 * i0, 4 * i1): float4 fmas in order, then a
// fixed pairwise reduction.
template <typename Fmt>
inline float values_dot(thread const typename Fmt::Block& blk, thread const float4* x, uint i0, uint i1) {
  float4 acc4 = 0.0f;
  for (uint i = i0; i < i1; i++) {
    const float4 v = float4(Fmt::value(blk, 4 * i), Fmt::value(blk, 4 * i + 1), Fmt::value(blk, 4 * i + 2),
                            Fmt::value(blk, 4 * i + 3));
    acc4 = fma(v, x[i], acc4);
  }
  return (acc4.x + acc4.y) + (acc4.z + acc4.w);
}

// ---------------------------------------------------------------------------------------
// MLX affine: w = scale * q + bias per group of GROUP weights, q an unsigned BITS-bit code
// (BITS in 2, 3, 4, 5, 6, 8). Weight [out][in*BITS/32] uint32 (a continuous bit stream per
// row: 32 codes fill exactly BITS words); scales, biases S [out][in/GROUP] (bfloat, or float
// for checkpoints whose scales are f32/f16). GROUP >= 32, so a block has one scale and one
// bias; dot uses s * sum(q x) + b * sum(x).
template <int BITS, int GROUP, typename S = bfloat>
struct affine {
  typedef S scale_t;
  static constexpr constant int WORDS = BITS;
  struct Block {
    uint w[BITS];
    float s, b;
  };
  static Block load(device const uint* w, device const S* scales, device const S* biases, ulong row, uint k,
                    uint nblk) {
    Block blk;
    load_words<BITS>(w + (row * nblk + k) * BITS, blk.w);
    const ulong g = row * (nblk * QBLOCK / GROUP) + k * QBLOCK / GROUP;
    blk.s = float(scales[g]);
    blk.b = float(biases[g]);
    return blk;
  }
  static float value(thread const Block& blk, uint j) { return float(stream_code<BITS>(blk.w, j)); }
  static float dot(thread const Block& blk, thread const float4* x, float xsum, float acc) {
    return fma(blk.s, values_dot<affine>(blk, x, 0, QBLOCK / 4), fma(blk.b, xsum, acc));
  }
  static void dequant(thread const Block& blk, thread float* out) {
    for (uint j = 0; j < QBLOCK; j++) out[j] = fma(blk.s, value(blk, j), blk.b);
  }
};

// ---------------------------------------------------------------------------------------
// Microscaling FP formats (mlx modes mxfp4, nvfp4, mxfp8): w = scale * value(code), no bias.
// Codes form the same little-endian stream as affine (FP4: 8 per word, element 0 lowest;
// FP8: 4 per word). Scales uint8 [out][in/GROUP]: E8M0 for mxfp4/mxfp8 (group 32), E4M3
// for nvfp4 (group 16: two scales per block, one per half). Every product is exact in f32.
// mxfp4 (E2M1 codes, BITS 4) and mxfp8 (E4M3 codes, BITS 8): one E8M0 scale per block.
template <int BITS>
struct mxfp {
  typedef uchar scale_t;
  static constexpr constant int WORDS = BITS;  // 32 codes of BITS bits
  struct Block {
    uint w[WORDS];
    float s;
  };
  static Block load(device const uint* w, device const uchar* scales, device const uchar*, ulong row, uint k,
                    uint nblk) {
    Block blk;
    load_words<WORDS>(w + (row * nblk + k) * WORDS, blk.w);
    blk.s = e8m0_value(scales[row * nblk + k]);
    return blk;
  }
  static float value(thread const Block& blk, uint j) {
    const uint c = stream_code<BITS>(blk.w, j);
    return BITS == 4 ? e2m1_value(c) : e4m3_value(c);
  }
  static float dot(thread const Block& blk, thread const float4* x, float, float acc) {
    return fma(blk.s, values_dot<mxfp>(blk, x, 0, QBLOCK / 4), acc);
  }
  static void dequant(thread const Block& blk, thread float* out) {
    for (uint j = 0; j < QBLOCK; j++) out[j] = blk.s * value(blk, j);
  }
};
typedef mxfp<4> mxfp4;
typedef mxfp<8> mxfp8;

struct nvfp4 {
  typedef uchar scale_t;
  static constexpr constant int WORDS = 4;
  struct Block {
    uint w[4];
    float s[2];  // weights 0..15, 16..31
  };
  static Block load(device const uint* w, device const uchar* scales, device const uchar*, ulong row, uint k,
                    uint nblk) {
    Block blk;
    load_words<4>(w + (row * nblk + k) * 4, blk.w);
    blk.s[0] = e4m3_value(scales[(row * nblk + k) * 2]);
    blk.s[1] = e4m3_value(scales[(row * nblk + k) * 2 + 1]);
    return blk;
  }
  static float value(thread const Block& blk, uint j) { return e2m1_value(stream_code<4>(blk.w, j)); }
  static float dot(thread const Block& blk, thread const float4* x, float, float acc) {
    const float lo = values_dot<nvfp4>(blk, x, 0, QBLOCK / 8), hi = values_dot<nvfp4>(blk, x, QBLOCK / 8, QBLOCK / 4);
    return fma(blk.s[1], hi, fma(blk.s[0], lo, acc));
  }
  static void dequant(thread const Block& blk, thread float* out) {
    for (uint j = 0; j < QBLOCK; j++) out[j] = blk.s[j / 16] * value(blk, j);
  }
};


// ---------------------------------------------------------------------------------------
// Unquantized weights: T [out][in] (bfloat, half or float), read as they are; the scales
// and biases buffers are not read (bind anything).
template <typename T>
struct dense {
  typedef uchar scale_t;
  static constexpr constant int WORDS = QBLOCK * sizeof(T) / 4;
  struct Block {
    float v[QBLOCK];
  };
  static Block load(device const uint* w, device const uchar*, device const uchar*, ulong row, uint k, uint nblk) {
    Block blk;
    device const T* src = (device const T*)(w + (row * nblk + k) * WORDS);
    for (uint j = 0; j < QBLOCK; j++) blk.v[j] = float(src[j]);
    return blk;
  }
  static float value(thread const Block& blk, uint j) { return blk.v[j]; }
  static float dot(thread const Block& blk, thread const float4* x, float, float acc) {
    return acc + values_dot<dense>(blk, x, 0, QBLOCK / 4);
  }
  static void dequant(thread const Block& blk, thread float* out) {
    for (uint j = 0; j < QBLOCK; j++) out[j] = blk.v[j];
  }
};

