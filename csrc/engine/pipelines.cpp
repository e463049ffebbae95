// Every kernel a step may dispatch, with the threadgroup size it wants and the least it
// can work with: Engine's constructor creates them all at load (no pipeline is compiled
// inside a step) and fails there if the GPU cannot run one, then resolves each into the slot
// a step dispatches it from (no name lookups while encoding). Sizes: shaders/params/*.h.
#include <algorithm>

#include "layer_tensors.h"
#include "dflash.h"
#include "mtp.h"

namespace mq::engine {
namespace {

constexpr uint32_t kSimd = MQ_SIMD_WIDTH;

ThreadgroupNeed exactly(uint32_t threads) { return {.preferred = threads, .minimum = threads}; }
ThreadgroupNeed up_to(uint32_t threads) { return {.preferred = threads, .minimum = kSimd}; }

// "_<format>" (e.g. "_b4_g64", "_mxfp4", "_bf16"): the kernel-name suffix of a projection's variant.
std::string quant_suffix(const QuantLinear& l) { return "_" + l.format; }

// "" for a bf16 norm/conv/dt_bias vector, "_wf32" for an f32 one (stored so, or widened from f16):
// the suffix of the kernels that read it (rms_norm, attention, DeltaNet conv and scan).
std::string vector_suffix(const DeviceTensor& t) { return t.desc->dtype == "F32" ? "_wf32" : ""; }

// The DeltaNet conv + scan kernel for a layer's conv1d / dt_bias and A_log dtypes.
std::string delta_scan_kernel(const DeltaNetWeights& m) {
  return std::string(m.a_log.desc->dtype == "F32" ? "delta_conv_scan_alog_f32" : "delta_conv_scan_alog_bf16") +
         vector_suffix(m.conv1d);
}

}  // namespace

uint32_t qmv_rows_per_simdgroup(uint64_t weight_rows, uint32_t gpu_cores) {
  const uint64_t wanted = uint64_t(MQ_QMV_THREADGROUPS_PER_CORE) * gpu_cores;
  for (uint32_t r : {8u, 4u})
    if ((weight_rows + MQ_QMV_SIMDGROUPS * r - 1) / (MQ_QMV_SIMDGROUPS * r) >= wanted) return r;
  return 2;
}

namespace {

// What a model's matvecs are planned for: the GPU's cores (R per shape) and whether its steps
// reach the deep verify tier (more than MQ_QMV_SMALL_ROWS rows; only then its kernels are built).
struct MatvecTiers {
  uint32_t gpu_cores;
  bool deep;
};

// The R variant of a matvec family for `weight_rows` rows (shaders/params/quant.h), and its
// deep tier's kernel when the engine's steps need it.
void plan_matvec(KernelPlan& plan, MatvecTiers t, QmvVariant& v, const std::string& op, const QuantLinear& l,
                 uint64_t weight_rows) {
  v.r = qmv_rows_per_simdgroup(weight_rows, t.gpu_cores);
  const std::string variant = "_r" + std::to_string(v.r) + quant_suffix(l);
  plan.need(v.one, op + variant, exactly(MQ_QMV_THREADS));
  plan.need(v.rows, op + "_rows" + variant, exactly(MQ_QMV_THREADS));
  if (t.deep)
    plan.need(v.deep, op + "_deep_r" + std::to_string(MQ_QMV_DEEP_R) + quant_suffix(l), exactly(MQ_QMV_THREADS));
}

// Per format: plain and norm-fused matvecs (the latter for a group of `normed_rows` rows in
// all, the members' sum where projections.cpp normalises the input of several projections at
// once), the GEMM.
void plan_projection(KernelPlan& plan, MatvecTiers t, QuantLinear& l, uint64_t normed_rows = 0) {
  ProjectionKernels& k = l.kernels;
  plan_matvec(plan, t, k.qmv, "qmv", l, l.out);
  plan_matvec(plan, t, k.qmv_norm, "qmv_norm", l, normed_rows ? normed_rows : l.out);
  plan.need(k.qmm, "qmm" + quant_suffix(l), exactly(MQ_QMM_THREADS));
}

// A part's projections by their role (layer_tensors.h): its normed ones are the members of one
// encode_normed_projections call; expert stacks take the MoE matvec and grouped GEMM.
template <class W, size_t N>
void plan_part(KernelPlan& plan, MatvecTiers t, W& part, const LayerTensor<W> (&table)[N]) {
  const std::vector<QuantLinear*> normed = projections(part, table, TensorRole::normed);
  uint64_t normed_rows = 0;
  for (const QuantLinear* p : normed) normed_rows += p->out;
  for (QuantLinear* p : normed) plan_projection(plan, t, *p, normed_rows);
  for (QuantLinear* p : projections(part, table, TensorRole::projection)) plan_projection(plan, t, *p);
  for (QuantLinear* p : projections(part, table, TensorRole::experts)) {
    plan.need(p->kernels.moe_qmv, "moe_qmv" + quant_suffix(*p), exactly(MQ_QMV_THREADS));
    plan.need(p->kernels.moe_qmm, "moe_qmm" + quant_suffix(*p), exactly(MQ_QMM_THREADS));
  }
}

}  // namespace

void Engine::plan_kernels(KernelPlan& plan) {
  const MatvecTiers tiers{device_->gpu_cores(), max_step_rows() > MQ_QMV_SMALL_ROWS};
  if (embeds() || mtp_) plan.need(embed_.kernels.embed, "embed" + quant_suffix(embed_), exactly(MQ_EMBED_THREADS));
  if (has_head()) {
    plan_projection(plan, tiers, lm_head_);
    plan.need(k_.final_norm, "rms_norm_residual" + vector_suffix(final_norm_), up_to(MQ_NORM_THREADS));
  } else {
    plan.need(k_.residual_add, "residual_add", up_to(kResidualAddThreads));
  }
  plan.need(k_.silu_mul, "silu_mul", up_to(kSiluMulThreads));
  plan.need(k_.copy_u32, "copy_u32", up_to(kCopyThreads));  // snapshots of the sequence state
  plan.need(k_.argmax_partial, "argmax_partial", up_to(MQ_ARGMAX_THREADS));
  plan.need(k_.argmax_final, "argmax_final", up_to(MQ_ARGMAX_THREADS));
  plan.need(k_.sample, "sample_top_kp", up_to(MQ_SAMPLE_THREADS));
  plan.need(k_.penalty_count, "penalty_count", up_to(MQ_PENALTY_THREADS));
  plan.need(k_.penalty_apply, "penalty_apply", up_to(MQ_PENALTY_THREADS));
  plan.need(k_.logprobs, "token_logprobs", up_to(MQ_LOGPROB_THREADS));
  plan.need(k_.token_mask, "token_mask", up_to(MQ_TOKEN_MASK_THREADS));
  plan.need(k_.logit_bias, "logit_bias", up_to(kLogitBiasThreads));
  // Verify steps and every Engine::step (drafts or not) accept through it.
  plan.need(k_.spec_accept, "spec_accept", exactly(1));
  if (options_.max_draft > 0) plan.need(k_.delta_restore, "delta_restore", up_to(kCopyThreads));  // rollbacks

  for (LayerWeights& l : layers_) plan_layer_kernels(plan, l);
  if (mtp_) {
    // The MTP head: its layer as the trunk's, fc, and its three norms (mtp.h).
    MtpWeights& m = *mtp_;
    plan_layer_kernels(plan, m.layer);
    plan_projection(plan, tiers, m.fc);
    plan.need(m.norm_embedding, "rms_norm" + vector_suffix(m.pre_fc_norm_embedding), up_to(MQ_NORM_THREADS));
    plan.need(m.norm_hidden, "rms_norm" + vector_suffix(m.pre_fc_norm_hidden), up_to(MQ_NORM_THREADS));
    plan.need(m.norm_residual, "rms_norm_residual" + vector_suffix(m.norm), up_to(MQ_NORM_THREADS));
    plan.need(m.fill_u32, "fill_u32", up_to(kCopyThreads));
  }
  if (dflash_) {
    // The DFlash drafter (dflash.h): unfused projections, norms, and its own attention kernels.
    DflashWeights& w = *dflash_;
    plan_projection(plan, tiers, w.fc);
    plan.need(w.capture, "dflash_capture", up_to(kCopyThreads));
    plan.need(w.attention, "dflash_attention", exactly(MQ_DFLASH_THREADS));
    plan.need(w.fill_u32, "fill_u32", up_to(kCopyThreads));
    plan.need(w.hidden_norm_kernel, "rms_norm" + vector_suffix(w.hidden_norm), up_to(MQ_NORM_THREADS));
    plan.need(w.final_norm_kernel, "rms_norm_residual" + vector_suffix(w.norm), up_to(MQ_NORM_THREADS));
    for (DflashLayer& l : w.layers) {
      for (QuantLinear* p :
           {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj})
        plan_projection(plan, tiers, *p);
      plan.need(l.input_norm_first, "rms_norm" + vector_suffix(l.input_norm), up_to(MQ_NORM_THREADS));
      plan.need(l.input_norm_residual, "rms_norm_residual" + vector_suffix(l.input_norm), up_to(MQ_NORM_THREADS));
      plan.need(l.post_norm_residual, "rms_norm_residual" + vector_suffix(l.post_norm), up_to(MQ_NORM_THREADS));
      plan.need(l.prep, "dflash_qk_norm_rope" + vector_suffix(l.q_norm), exactly(MQ_DFLASH_THREADS));
    }
  }
}

// One layer's kernels: its parts' projections (plan_part), then the kernels of each part's
// own (norms, the fused MLP and MoE matvecs, the mixers).
void Engine::plan_layer_kernels(KernelPlan& plan, LayerWeights& l) {
  const MatvecTiers tiers{device_->gpu_cores(), max_step_rows() > MQ_QMV_SMALL_ROWS};
  const uint32_t rep = uint32_t(model_.dims.heads / model_.dims.kv_heads);
  const std::string cache = options_.kv_bits == 8 ? "q8" : "f16";
  LayerKernels& k = l.kernels;
  MlpWeights& mlp = l.moe ? l.moe->shared_expert : *l.mlp;
  plan_part(plan, tiers, mlp, kMlpTensors);
  // gate and up with the post norm and the activation (one format)
  plan_matvec(plan, tiers, mlp.gate_proj.kernels.qmv_norm_silu, "qmv_norm_silu", mlp.gate_proj,
              uint64_t(mlp.gate_proj.out) + mlp.up_proj.out);
  plan.need(k.input_norm, "rms_norm" + vector_suffix(l.input_norm), up_to(MQ_NORM_THREADS));
  plan.need(k.input_norm_residual, "rms_norm_residual" + vector_suffix(l.input_norm), up_to(MQ_NORM_THREADS));
  plan.need(k.post_norm_residual, "rms_norm_residual" + vector_suffix(l.post_norm), up_to(MQ_NORM_THREADS));
  if (l.moe) {
    MoeWeights& m = *l.moe;
    plan_part(plan, tiers, m, kMoeTensors);
    // The fused decode/verify block: routing + gate/up + silu, down + the weighted sum.
    plan.need(m.gate_proj.kernels.moe_qmv_route_silu, "moe_qmv_route_silu" + quant_suffix(m.gate_proj),
              exactly(MQ_QMV_THREADS));
    plan.need(m.down_proj.kernels.moe_qmv_combine, "moe_qmv_combine" + quant_suffix(m.down_proj),
              exactly(MQ_QMV_THREADS));
    plan.need(k_.moe_route, "moe_route", exactly(MQ_MOE_ROUTE_THREADS));
    plan.need(k_.moe_group, "moe_group", up_to(MQ_MOE_GROUP_THREADS));
    plan.need(k_.moe_gather_rows, "moe_gather_rows", up_to(kMoeRowThreads));
    plan.need(k_.moe_combine, "moe_combine", up_to(kMoeRowThreads));
  }
  if (l.delta) {
    DeltaNetWeights& m = *l.delta;
    plan_part(plan, tiers, m, kDeltaNetTensors);
    plan_matvec(plan, tiers, m.out_proj.kernels.qmv_head_norm, "qmv_head_norm", m.out_proj, m.out_proj.out);
    plan.need(k.conv_scan, delta_scan_kernel(m), up_to(kSimd * MQ_DELTA_SCAN_SIMDGROUPS));
    plan.need(k.norm_history, "delta_norm_history", up_to(kSimd * MQ_DELTA_NORM_SIMDGROUPS));
  } else {
    AttentionWeights& m = *l.attn;
    plan_part(plan, tiers, m, kAttentionTensors);
    const std::string vectors = vector_suffix(m.q_norm);
    plan.need(k.attn_prep, "attn_qk_norm_rope_append_" + cache + vectors, up_to(kSimd * MQ_ATTN_PREP_SIMDGROUPS));
    // One SIMD-group per query head of a kv head, as many as the kernels take.
    const ThreadgroupNeed decode = up_to(kSimd * std::min<uint32_t>(rep, MQ_ATTN_DECODE_MAX_SIMDGROUPS));
    plan.need(k.attn_decode_r1, "attn_decode_" + cache + "_r1" + vectors, decode);
    plan.need(k.attn_decode_r4, "attn_decode_" + cache + "_r4" + vectors, decode);
    plan.need(k_.attn_combine, "attn_decode_combine", up_to(MQ_ATTN_COMBINE_THREADS));
    // Whole multiples of the query heads of a kv head where they fit.
    const uint32_t prefill_sg = rep <= MQ_ATTN_PREFILL_MAX_SIMDGROUPS ? MQ_ATTN_PREFILL_MAX_SIMDGROUPS / rep * rep
                                                                      : MQ_ATTN_PREFILL_MAX_SIMDGROUPS;
    plan.need(k.attn_prefill, "attn_prefill_" + cache, up_to(kSimd * prefill_sg));
  }
}

}  // namespace mq::engine
