// Every kernel of the library, per .metal file, as tables that the .metal files instantiate
// and the engine reads (csrc/engine/shader_source.cpp: a model's library holds only the
// kernels it runs; _core.kernel_names() lists them all):
//   K(host name, function, template arguments...)  one instance of a kernel template
//   P(name)                                        a plain kernel, defined in its family's header
// The projection families have one table per weight format F, whose quant_formats.h type is
// the trailing arguments (MQ_WEIGHT_FORMATS, params/quant.h). Each family's kernel bodies
// live in <family>.h; <family>.metal instantiates its table.
#pragma once

// The matvec variants of R rows per SIMD-group (params/quant.h): host names <op>_r<R>_<F>.
#define MQ_EACH_R(K, op, F, func, ...)                                                  \
  K(#op "_r2_" #F, func, __VA_ARGS__, 2) K(#op "_r4_" #F, func, __VA_ARGS__, 4) \
  K(#op "_r8_" #F, func, __VA_ARGS__, 8)

// The deep verify tier (params/quant.h): up to MQ_QMV_MAX_ROWS rows at R = MQ_QMV_DEEP_R only.
#define MQ_STRINGIFY(x) #x
#define MQ_STRINGIFY_VALUE(x) MQ_STRINGIFY(x)
#define MQ_DEEP_R(K, op, F, func, ...) \
  K(#op "_deep_r" MQ_STRINGIFY_VALUE(MQ_QMV_DEEP_R) "_" #F, func, __VA_ARGS__, MQ_QMV_DEEP_R)

// quant.metal: decode and verify matvecs, prefill GEMM, embedding gather.
#define MQ_QUANT_FORMAT_KERNELS(K, F, ...)                                                            \
  MQ_EACH_R(K, qmv, F, qmv, __VA_ARGS__) MQ_EACH_R(K, qmv_rows, F, qmv_rows, __VA_ARGS__, MQ_QMV_SMALL_ROWS) \
  MQ_DEEP_R(K, qmv, F, qmv_rows, __VA_ARGS__, MQ_QMV_MAX_ROWS)                                      \
  K("qmm_" #F, qmm, __VA_ARGS__) K("embed_" #F, embed, __VA_ARGS__)

// qmv_norm.metal: norm-fused matvecs, one row (M = 1) or verify rows (small and deep tiers).
#define MQ_QMV_NORM_FORMAT_KERNELS(K, F, ...)                                                             \
  MQ_EACH_R(K, qmv_norm, F, qmv_norm, __VA_ARGS__, 1)                                              \
  MQ_EACH_R(K, qmv_norm_rows, F, qmv_norm, __VA_ARGS__, MQ_QMV_SMALL_ROWS)                         \
  MQ_DEEP_R(K, qmv_norm, F, qmv_norm, __VA_ARGS__, MQ_QMV_MAX_ROWS)                                \
  MQ_EACH_R(K, qmv_norm_silu, F, qmv_norm_silu, __VA_ARGS__, 1)                                    \
  MQ_EACH_R(K, qmv_norm_silu_rows, F, qmv_norm_silu, __VA_ARGS__, MQ_QMV_SMALL_ROWS)               \
  MQ_DEEP_R(K, qmv_norm_silu, F, qmv_norm_silu, __VA_ARGS__, MQ_QMV_MAX_ROWS)

// qmv_head_norm.metal: DeltaNet's out_proj with the gated norm's factor in its input load.
#define MQ_QMV_HEAD_NORM_FORMAT_KERNELS(K, F, ...)                                   \
  MQ_EACH_R(K, qmv_head_norm, F, qmv_head_norm, __VA_ARGS__, 1)                    \
  MQ_EACH_R(K, qmv_head_norm_rows, F, qmv_head_norm, __VA_ARGS__, MQ_QMV_SMALL_ROWS) \
  MQ_DEEP_R(K, qmv_head_norm, F, qmv_head_norm, __VA_ARGS__, MQ_QMV_MAX_ROWS)

// moe.metal: routing, grouping and combining, and the expert projections per format.
#define MQ_MOE_KERNELS(K, P) P(moe_route) P(moe_group) P(moe_gather_rows) P(moe_combine)
#define MQ_MOE_FORMAT_KERNELS(K, F, ...)                                            \
  K("moe_qmv_" #F, moe_qmv, __VA_ARGS__) K("moe_qmm_" #F, moe_qmm, __VA_ARGS__) \
  K("moe_qmv_route_silu_" #F, moe_qmv_route_silu, __VA_ARGS__)                   \
  K("moe_qmv_combine_" #F, moe_qmv_combine, __VA_ARGS__)

// attention.metal: q8 or f16 cache, r1/r4 decode row groups, bf16 or f32 (_wf32) norm vectors.
#define MQ_ATTENTION_KERNELS(K, P)                                                           \
  K("attn_qk_norm_rope_append_q8", attn_qk_norm_rope_append, true, bfloat)                  \
  K("attn_qk_norm_rope_append_q8_wf32", attn_qk_norm_rope_append, true, float)              \
  K("attn_qk_norm_rope_append_f16", attn_qk_norm_rope_append, false, bfloat)                \
  K("attn_qk_norm_rope_append_f16_wf32", attn_qk_norm_rope_append, false, float)            \
  K("attn_decode_q8_r1", attn_decode, true, 1, bfloat)                                      \
  K("attn_decode_q8_r1_wf32", attn_decode, true, 1, float)                                  \
  K("attn_decode_q8_r4", attn_decode, true, 4, bfloat)                                      \
  K("attn_decode_q8_r4_wf32", attn_decode, true, 4, float)                                  \
  K("attn_decode_f16_r1", attn_decode, false, 1, bfloat)                                    \
  K("attn_decode_f16_r1_wf32", attn_decode, false, 1, float)                                \
  K("attn_decode_f16_r4", attn_decode, false, 4, bfloat)                                    \
  K("attn_decode_f16_r4_wf32", attn_decode, false, 4, float)                                \
  P(attn_decode_combine) K("attn_prefill_q8", attn_prefill, true) K("attn_prefill_f16", attn_prefill, false)

// deltanet.metal: the scan per A_log dtype (and f32 conv/norm vectors), the prefill norm pass,
// the rollback.
#define MQ_DELTANET_KERNELS(K, P)                                          \
  K("delta_conv_scan_alog_f32", delta_conv_scan, float, bfloat)           \
  K("delta_conv_scan_alog_bf16", delta_conv_scan, bfloat, bfloat)         \
  K("delta_conv_scan_alog_f32_wf32", delta_conv_scan, float, float)       \
  P(delta_norm_history) P(delta_restore)

// norm.metal: bf16 or f32 (_wf32) norm weights.
#define MQ_NORM_KERNELS(K, P)                                                                   \
  K("rms_norm", rms_norm, bfloat) K("rms_norm_residual", rms_norm_residual, bfloat)            \
  K("rms_norm_wf32", rms_norm, float) K("rms_norm_residual_wf32", rms_norm_residual, float)    \
  P(silu_mul) P(residual_add)

// copy.metal: 32-bit elements.
#define MQ_COPY_KERNELS(K, P)                                                             \
  K("copy_f32", copy_rows, float) K("copy_u32", copy_rows, uint) K("fill_f32", fill_rows, float) \
  K("fill_u32", fill_rows, uint)

// dflash.metal: the DFlash drafter (bf16 or f32 (_wf32) q/k norm weights).
#define MQ_DFLASH_KERNELS(K, P)                                                                          \
  P(dflash_capture) K("dflash_qk_norm_rope", dflash_qk_norm_rope, bfloat)                          \
  K("dflash_qk_norm_rope_wf32", dflash_qk_norm_rope, float) P(dflash_attention)

// sampling.metal.
#define MQ_SAMPLING_KERNELS(K, P)                                                                    \
  P(argmax_partial) P(argmax_final) P(sample_top_kp) P(penalty_count) P(penalty_apply) P(spec_accept) \
  P(token_logprobs) P(token_mask) P(logit_bias)

// vision.metal: the vision tower. Linears per weight format F (weight type, bias type: f16
// weights come with the f32 vectors they are widened to) and epilogue; the rest per vector type.
#define MQ_VISION_LINEAR_KERNELS(K, F, W, B)                                                     \
  K("vision_linear_" #F, vision_linear, W, B, 0, false)                                           \
  K("vision_linear_gelu_tanh_" #F, vision_linear, W, B, 1, false)                                 \
  K("vision_linear_gelu_erf_" #F, vision_linear, W, B, 2, false)                                  \
  K("vision_linear_residual_" #F, vision_linear, W, B, 0, true)
// Quantized linears run the projections' qmm, then these per bias type B (f16 biases are
// widened to f32 at load).
#define MQ_VISION_BIAS_KERNELS(K, F, B)                              \
  K("vision_bias_" #F, vision_bias, B, 0, false)                     \
  K("vision_bias_gelu_tanh_" #F, vision_bias, B, 1, false)           \
  K("vision_bias_gelu_erf_" #F, vision_bias, B, 2, false)            \
  K("vision_bias_residual_" #F, vision_bias, B, 0, true)
#define MQ_VISION_KERNELS(K, P)                                                                   \
  MQ_VISION_LINEAR_KERNELS(K, bf16, bfloat, bfloat) MQ_VISION_LINEAR_KERNELS(K, f16, half, float) \
  MQ_VISION_LINEAR_KERNELS(K, f32, float, float)                                                  \
  MQ_VISION_BIAS_KERNELS(K, bf16, bfloat) MQ_VISION_BIAS_KERNELS(K, f32, float)                     \
  K("vision_layer_norm", vision_layer_norm, bfloat) K("vision_layer_norm_wf32", vision_layer_norm, float) \
  K("vision_pos_embed_bf16", vision_pos_embed, bfloat) K("vision_pos_embed_f16", vision_pos_embed, half)  \
  K("vision_pos_embed_f32", vision_pos_embed, float) P(vision_rope) P(vision_attention)

#ifdef __METAL_VERSION__
// As MLX writes them: the instance's signature is the template's (decltype).
#define MQ_INSTANTIATE(name, func, ...) \
  template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;
#define MQ_DEFINED_IN_HEADER(name)
#endif
