// Every kernel a step may dispatch, with the threadgroup size it wants and the least it
// can work with: Engine's constructor creates them all at load (no pipeline is compiled
// inside a step) and fails there if the GPU cannot run one. Sizes: shaders/params/*.h.
#include <algorithm>

#include "mtp.h"
#include "workspace.h"

namespace mq::engine {
namespace {

constexpr uint32_t kSimd = MQ_SIMD_WIDTH;

ThreadgroupNeed exactly(uint32_t threads) { return {threads, threads}; }
ThreadgroupNeed up_to(uint32_t threads) { return {threads, kSimd}; }

}  // namespace

std::string quant_suffix(const QuantLinear& l) { return "_" + l.format; }

std::string vector_suffix(const DeviceTensor& t) { return t.desc->dtype == "F32" ? "_wf32" : ""; }

std::string delta_scan_kernel(const DeltaNetWeights& m) {
  return std::string(m.a_log.desc->dtype == "F32" ? "delta_conv_scan_alog_f32" : "delta_conv_scan_alog_bf16") +
         vector_suffix(m.conv1d);
}

std::map<std::string, ThreadgroupNeed> Engine::kernel_needs() const {
  std::map<std::string, ThreadgroupNeed> needs;
  // Per format (names repeat across projections): plain and norm-fused matvecs, the GEMM.
  auto projection = [&](const QuantLinear& l) {
    for (const char* op : {"qmv", "qmv_rows", "qmv_norm", "qmv_norm_rows"})
      needs[op + quant_suffix(l)] = exactly(MQ_QMV_THREADS);
    needs["qmm" + quant_suffix(l)] = exactly(MQ_QMM_THREADS);
  };
  needs["embed" + quant_suffix(embed_)] = exactly(MQ_EMBED_THREADS);
  projection(lm_head_);
  // Norms: the final one, then each layer's (the residual form everywhere but layer 0's input).
  needs["rms_norm_residual" + vector_suffix(final_norm_)] = up_to(MQ_NORM_THREADS);
  needs["silu_mul"] = up_to(kSiluMulThreads);
  needs["copy_u32"] = up_to(kCopyThreads);  // snapshots of the sequence state
  needs["argmax_partial"] = needs["argmax_final"] = up_to(MQ_ARGMAX_THREADS);
  needs["sample_top_kp"] = up_to(MQ_SAMPLE_THREADS);
  needs["penalty_count"] = needs["penalty_apply"] = up_to(MQ_PENALTY_THREADS);
  if (options_.max_draft > 0) {  // speculative verify steps
    needs["spec_accept"] = exactly(1);
    needs["delta_restore"] = up_to(kCopyThreads);
  }
  needs["token_logprobs"] = up_to(MQ_LOGPROB_THREADS);

  const uint32_t rep = uint32_t(model_.dims.heads / model_.dims.kv_heads);
  const std::string cache = options_.kv_bits == 8 ? "q8" : "f16";
  std::vector<const LayerWeights*> layers;
  for (const LayerWeights& l : layers_) layers.push_back(&l);
  if (mtp_) {
    // The MTP head: its layer as the trunk's, fc, and its three norms (mtp.h).
    layers.push_back(&mtp_->layer);
    projection(mtp_->fc);
    needs["rms_norm" + vector_suffix(mtp_->pre_fc_norm_embedding)] =
        needs["rms_norm" + vector_suffix(mtp_->pre_fc_norm_hidden)] =
            needs["rms_norm_residual" + vector_suffix(mtp_->norm)] = up_to(MQ_NORM_THREADS);
  }
  for (const LayerWeights* layer : layers) {
    const LayerWeights& l = *layer;
    const MlpWeights& mlp = l.moe ? l.moe->shared_expert : *l.mlp;
    for (const QuantLinear* p : {&mlp.gate_proj, &mlp.up_proj, &mlp.down_proj}) projection(*p);
    if (!l.moe)  // gate and up with the post norm and the activation (one format)
      needs["qmv_norm_silu" + quant_suffix(mlp.gate_proj)] = needs["qmv_norm_silu_rows" + quant_suffix(mlp.gate_proj)] =
          exactly(MQ_QMV_THREADS);
    needs["rms_norm" + vector_suffix(l.input_norm)] = needs["rms_norm_residual" + vector_suffix(l.input_norm)] =
        needs["rms_norm_residual" + vector_suffix(l.post_norm)] = up_to(MQ_NORM_THREADS);
    if (l.moe) {
      const MoeWeights& m = *l.moe;
      projection(m.gate);
      projection(m.shared_expert_gate);
      for (const QuantLinear* p : {&m.gate_proj, &m.up_proj, &m.down_proj}) {
        needs["moe_qmv" + quant_suffix(*p)] = exactly(MQ_QMV_THREADS);
        needs["moe_qmm" + quant_suffix(*p)] = exactly(MQ_QMM_THREADS);
      }
      needs["moe_route"] = exactly(MQ_MOE_ROUTE_THREADS);
      needs["moe_group"] = up_to(MQ_MOE_GROUP_THREADS);
      needs["moe_gather_rows"] = needs["moe_combine"] = up_to(kMoeRowThreads);
    }
    if (l.delta) {
      const DeltaNetWeights& m = *l.delta;
      for (const QuantLinear* p : {&m.in_proj_qkv, &m.in_proj_z, &m.in_proj_b, &m.in_proj_a, &m.out_proj})
        projection(*p);
      needs[delta_scan_kernel(m)] = up_to(kSimd * MQ_DELTA_SCAN_SIMDGROUPS);
      needs["delta_norm_history" + vector_suffix(m.norm)] = up_to(kSimd * MQ_DELTA_NORM_SIMDGROUPS);
    } else {
      const AttentionWeights& m = *l.attn;
      for (const QuantLinear* p : {&m.q_proj, &m.k_proj, &m.v_proj, &m.o_proj}) projection(*p);
      needs["attn_qk_norm_rope_append_" + cache + vector_suffix(m.q_norm)] = up_to(kSimd * MQ_ATTN_PREP_SIMDGROUPS);
      // One SIMD-group per query head of a kv head, as many as the kernels take.
      needs["attn_decode_" + cache + "_r1" + vector_suffix(m.q_norm)] =
          needs["attn_decode_" + cache + "_r4" + vector_suffix(m.q_norm)] =
          up_to(kSimd * std::min<uint32_t>(rep, MQ_ATTN_DECODE_MAX_SIMDGROUPS));
      needs["attn_decode_combine"] = up_to(MQ_ATTN_COMBINE_THREADS);
      // Whole multiples of the query heads of a kv head where they fit.
      const uint32_t prefill_sg = rep <= MQ_ATTN_PREFILL_MAX_SIMDGROUPS
                                      ? MQ_ATTN_PREFILL_MAX_SIMDGROUPS / rep * rep
                                      : MQ_ATTN_PREFILL_MAX_SIMDGROUPS;
      needs["attn_prefill_" + cache] = up_to(kSimd * prefill_sg);
    }
  }
  return needs;
}

}  // namespace mq::engine
