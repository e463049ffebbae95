// Parameters of shaders/moe.metal: the sparse MoE MLP (router top-k, expert grouping,
// gathered expert matvec / grouped expert GEMM, weighted combine).
//
// A "pair" is one (row, slot) of the routing: pair q = row * top_k + slot, slot < top_k,
// ordered by decreasing router probability. Expert weights are stacked MLX affine tensors
// [experts][out][in*BITS/32] (scales/biases [experts][out][in/GROUP]); moe_qmv / moe_qmm use
// quant.metal's qmv / qmm bodies on one expert's slice, so quant.h's rules apply to each.
#pragma once

// moe_route keeps each lane's share of the router probabilities in registers and
// moe_group one counter per expert in threadgroup memory: the engine checks num_experts
// and num_experts_per_tok against these at load.
#define MQ_MOE_MAX_EXPERTS 512
#define MQ_MOE_MAX_TOP_K 16

// moe_route: one SIMD-group per row; dispatch `rows` threadgroups of 32 threads.
#define MQ_MOE_ROUTE_THREADS 32
// moe_group: ONE threadgroup of up to MQ_MOE_GROUP_THREADS threads (any multiple of 32;
// the kernel reads its size).
#define MQ_MOE_GROUP_THREADS 256

// probs = softmax(logits[row][0 .. experts)); the top_k largest (ties: lower expert id
// first) go to ids/weights[row][0 .. top_k) in decreasing order; weights are the chosen
// probabilities, divided by their sum when norm_top_k != 0.
struct MoeRouteParams {
  uint experts;       // 1 .. MQ_MOE_MAX_EXPERTS
  uint top_k;         // 1 .. min(experts, MQ_MOE_MAX_TOP_K)
  uint logit_stride;  // floats from one row of logits to the next
  uint norm_top_k;    // 0 or 1 (config norm_topk_prob)
};

// Groups the pairs by expert: expert e's pairs are order[offsets[e] .. offsets[e+1]),
// ascending pair index within a group; slot[q] is pair q's position in order.
struct MoeGroupParams {
  uint experts;
  uint pairs;  // rows * top_k
};

// dst[i][0 .. dim) = src[order[i] / top_k][0 .. dim), i < pairs: each pair's input row,
// in grouped order. Dispatch threads (ceil(dim / 4), pairs), any threadgroup shape; dim
// and the strides multiples of 4, bindings 16-byte aligned.
struct MoeGatherParams {
  uint dim;
  uint pairs;
  uint top_k;
  uint src_stride;  // floats from one src row to the next
  uint dst_stride;
};

// Expert projections, y = W[e] x for each pair:
//   moe_qmv (decode and verify rows): pair q = tg.y uses expert ids[q] and x row
//     q / x_pairs; dispatch threadgroups (ceil(out_dim / MQ_QMV_ROWS_PER_THREADGROUP), pairs)
//     of MQ_QMV_THREADS threads.
//   moe_qmm (prefill, after moe_group/moe_gather_rows): expert e = tg.z multiplies its rows
//     offsets[e] .. offsets[e+1) of the grouped x; dispatch threadgroups
//     (ceil(rows / MQ_QMM_TILE_ROWS), ceil(out_dim / MQ_QMM_TILE_OUT), experts) of
//     MQ_QMM_THREADS threads, where `rows` bounds any expert's row count (the chunk's rows:
//     a token picks an expert at most once); tiles past an expert's rows return at once.
struct MoeMatmulParams {
  uint in_dim;    // multiple of the group size
  uint out_dim;
  uint experts;   // of the stacked weight
  uint x_pairs;   // moe_qmv: pairs per x row (top_k when x is per token, 1 when per pair)
  uint x_stride;  // floats from one x row to the next (multiple of 4)
  uint y_stride;  // floats from one y row to the next
};

// y[r][i] = sum_s weights[r][s] * expert_out[row of pair r*top_k+s][i]
//           + sigmoid(shared_gate[r * gate_stride]) * y[r][i]
// (y holds the shared expert's output on entry). The row of pair q is slot[q] when
// grouped != 0 (prefill), else q. Dispatch threads (ceil(dim / 4), rows), any
// threadgroup shape; dim and the strides multiples of 4.
struct MoeCombineParams {
  uint dim;
  uint rows;
  uint top_k;
  uint grouped;      // 0 or 1
  uint eo_stride;    // floats from one expert_out row to the next
  uint y_stride;
  uint gate_stride;  // floats from one row's shared gate logit to the next
};
