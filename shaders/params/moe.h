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

// The decode/verify MoE block in three barrier intervals (forward.cpp, encode_moe_mlp); rows
// 1..MQ_QMV_MAX_ROWS, and a pair's (or a row's) arithmetic never depends on how many rows
// there are, so a verify row is bit-identical to a decode row:
//   moe_qmv_route_silu: pair q = tg.y routes its row r = q / top_k as moe_route does (every
//     SIMD-group recomputes the softmax + top-k from the router logits: no route dispatch and
//     no barrier before the experts), then act[q][j] = silu(gate_e . x[r]) * (up_e . x[r]),
//     e = the pair's expert, j < out_dim; threadgroup (0, q) writes ids[q] and weights[q] for
//     moe_qmv_combine. A SIMD-group walks MQ_QMV_ROWS_PER_SIMDGROUP / 2 rows of gate and the
//     same rows of up: dispatch threadgroups (ceil(out_dim / MQ_MOE_SILU_ROWS_PER_THREADGROUP),
//     rows * top_k) of MQ_QMV_THREADS threads.
#define MQ_MOE_SILU_ROWS_PER_THREADGROUP (MQ_QMV_ROWS_PER_THREADGROUP / 2)
struct MoeRouteSiluParams {
  uint in_dim;        // hidden size: multiple of the group size
  uint out_dim;       // moe_intermediate: rows of each expert's gate and up
  uint experts;       // 1 .. MQ_MOE_MAX_EXPERTS
  uint top_k;         // 1 .. min(experts, MQ_MOE_MAX_TOP_K)
  uint norm_top_k;    // 0 or 1 (config norm_topk_prob)
  uint logit_stride;  // floats from one row of router logits to the next
  uint x_stride;      // floats from one x row to the next (multiple of 4)
  uint act_stride;    // floats from one act row (pair) to the next
};

//   moe_qmv_combine: y[r][j] = sum_s weights[q] * (down_{ids[q]} . act[q])_j
//                              + sigmoid(shared_gate[r * gate_stride]) * y[r][j],
//     q = r * top_k + s in slot order (moe_combine's arithmetic), y holding the shared expert's
//     output on entry; each y element is read and written by one thread (no atomics).
//     Dispatch threadgroups (ceil(out_dim / MQ_QMV_ROWS_PER_THREADGROUP), rows) of MQ_QMV_THREADS.
struct MoeCombineQmvParams {
  uint in_dim;       // moe_intermediate: multiple of the group size
  uint out_dim;      // hidden size
  uint experts;      // of the stacked down weight
  uint top_k;
  uint act_stride;   // floats from one act row (pair) to the next (multiple of 4)
  uint gate_stride;  // floats from one row's shared gate logit to the next
  uint y_stride;
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
