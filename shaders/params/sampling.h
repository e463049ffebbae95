// Parameters of shaders/sampling.metal: penalties, greedy argmax and the temperature /
// top-k / top-p / min-p sampler over rows of logits, writing token ids into a device-side ids buffer (so the
// next step's embedding reads them without a CPU round trip).
#pragma once

// Buffers (f32 unless stated):
//   logits   [rows][row_stride], the first n entries of a row are its vocabulary
//   partials uint2 [rows][n_partials]: (as_type<uint>(best value), its index)
//   ids      uint [..]: row r's token id is written at ids[out_pos + r]

// argmax_partial: stage 1, threadgroup (g, r) reduces logits[r][g*chunk .. (g+1)*chunk)
// (clipped to n). Dispatch (n_partials, rows) threadgroups, n_partials = ceil(n / chunk),
// of any multiple of 32 threads up to 1024 (MQ_ARGMAX_THREADS is a good choice).
// argmax_final: stage 2, one threadgroup per row (dispatch (rows) threadgroups, any
// multiple of 32 threads). Lowest index wins ties (also for an all-equal row); NaN is
// never chosen; a row with no non-NaN entry gives id 0.
#define MQ_ARGMAX_THREADS 256
struct ArgmaxParams {
  uint n;           // vocabulary size
  uint row_stride;  // floats between rows of logits (>= n)
  uint chunk;       // entries per stage-1 threadgroup
  uint n_partials;  // stage-1 threadgroups per row
  uint out_pos;     // ids[out_pos + row]
};

// sample_top_kp: one threadgroup per row (dispatch (rows) threadgroups of
// MQ_SAMPLE_THREADS threads, its declared maximum; any multiple of 32 up to it works, the
// draw for a given seed depends on it only through float summation order). Temperature must be > 0: the
// engine routes temperature 0 to argmax (the kernel answers argmax for <= 0 anyway).
// The RNG is Philox4x32-10, key (seed_lo, seed_hi), counter (counter + row, 0, 0, 0):
// a draw depends only on the request's seed and the position it samples.
#define MQ_SAMPLE_THREADS 1024
// Candidates the sampler can hold in threadgroup memory (threshold resolution).
#define MQ_SAMPLE_CAP 2048
// Speculative verify rows (`drafts` > 0): row r < drafts holds a draft token d =
// draft_ids[draft_pos + r], a point mass proposed for the token this row samples. With p
// the row's kept, renormalised distribution, d is written with probability p(d) (a second
// Philox word, counter (counter + row, 1, 0, 0), decides); otherwise the row draws from p
// with d removed and renormalised, so it never writes d. The token written is thus
// distributed as p whatever d is (speculative sampling, Leviathan et al. 2023, with q a
// point mass), and "written == d" tells acceptance. Rows >= drafts draw as usual.
struct SampleParams {
  uint n;             // vocabulary size
  uint row_stride;    // floats between rows of logits (>= n)
  uint top_k;         // keep logits >= the k-th largest; 0 = off
  float top_p;        // keep the smallest top set with probability >= top_p; 1.0 = off
  float temperature;  // > 0
  float min_p;        // then keep tokens with probability >= min_p * the top one; 0 = off
  uint seed_lo;       // per-request 64-bit seed
  uint seed_hi;
  uint counter;       // position of row 0 (row r draws with counter + r)
  uint out_pos;       // ids[out_pos + row]
  uint drafts;        // rows [0, drafts) verify a draft (see above); 0 = plain sampling
  uint draft_pos;     // row r's draft is draft_ids[draft_pos + r]
};

// spec_accept: after a verify step chose a token for each of its drafts + 1 rows (chosen
// [rows]: argmax, or sample_top_kp in draft mode), counts the leading rows whose choice
// equals the row's draft ids[draft_pos + r] (r < drafts): that many drafts are accepted.
// Writes the count to accepted[0] and the choice of the first row not accepted (the
// correction, or the bonus token when all are) to ids[draft_pos + accepted[0]], where the
// next step reads it. One thread: dispatch 1 threadgroup of 1 thread.
struct SpecAcceptParams {
  uint drafts;     // draft rows of the verify step (rows - 1)
  uint draft_pos;  // position of the first draft in ids
};

// Penalties, applied before the choice (argmax or sampler) to one row of logits, as vLLM
// does: repetition over every token of the context, then frequency and presence over the
// generated ones. Two dispatches in one step:
// penalty_count: one thread per position in [start, end) (dispatch end - start threads,
// any threadgroup size): counts[ids[pos]] += 1, and counts[n + ids[pos]] += 1 when
// pos >= generated_from. Device atomics: the counts are exact whatever the order.
// penalty_apply: one thread per vocabulary entry (dispatch n threads): writes the
// penalised row into `penalised` and puts its two counts back to 0, so `counts` is all
// zeros between steps (the engine zeroes it once at allocation).
//   penalised[i] = l' - frequency * counts[n + i] - presence * (counts[n + i] > 0),
//   l' = counts[i] > 0 ? (l > 0 ? l / repetition : l * repetition) : l,  l = logits[i].
//   counts uint [2][n]: (context occurrences, generated occurrences); penalised [n].
#define MQ_PENALTY_THREADS 256
struct PenaltyParams {
  uint n;               // vocabulary size
  uint start;           // first position counted (0 with a repetition penalty, else generated_from)
  uint generated_from;  // first generated position: the tokens after the prompt
  uint end;             // positions [start, end) of ids are counted
  float repetition;     // 1 = off
  float presence;       // 0 = off
  float frequency;      // 0 = off
};

// token_logprobs: the log-probabilities OpenAI's `logprobs` reports, over one RAW row of
// logits (before penalties and temperature, as vLLM's default "raw logprobs"): NaN counts
// as -inf; logsumexp = m + log(sum exp(l - m)), m the max (f32 accumulation); the chosen
// token's logprob (its id read from ids[out_pos], written by the choice before it) and the
// top_n (<= MQ_LOGPROB_MAX_TOP, <= n) largest entries, descending, ties lower id first.
// A row needs a finite max (otherwise the logprobs are -inf or NaN).
// One threadgroup (dispatch (1) threadgroup of any multiple of 32 threads up to
// MQ_LOGPROB_THREADS). Output: entry `slot` of out, MQ_LOGPROB_ENTRY_WORDS 4-byte words:
//   [0] chosen id (uint)   [1] chosen logprob   [2] logsumexp   [3] top_n (uint)
//   [4, 4 + top_n) top ids (uint)   [4 + MQ_LOGPROB_MAX_TOP, + top_n) their logprobs
// Decode keeps steps in flight, so the engine writes position p's entry at slot
// p % MQ_LOGPROB_SLOTS and reads it once that step is waited for.
#define MQ_LOGPROB_THREADS 256
#define MQ_LOGPROB_MAX_TOP 20
#define MQ_LOGPROB_ENTRY_WORDS (4 + 2 * MQ_LOGPROB_MAX_TOP)
#define MQ_LOGPROB_SLOTS 4
struct LogprobParams {
  uint n;        // vocabulary size
  uint top_n;    // entries of the top list, <= MQ_LOGPROB_MAX_TOP and <= n; 0 = chosen only
  uint out_pos;  // the chosen id is ids[out_pos]
  uint slot;     // the entry of out written
};

// Structured output and OpenAI's logit_bias, applied in place to rows of logits before the
// choice (argmax or sample_top_kp). The engine (choice.cpp) masks the raw row first (so the
// logprobs see the masked row, as vLLM's), biases a copy of it, then applies the penalties
// to that copy (vLLM's order); a refused token stays -inf whatever its bias.
// token_mask: a grammar's allowed tokens, one bit per token: bit t % 32 of word t / 32 of
// the row's mask (LSB first, llguidance's layout) set = token t allowed; a refused token's
// logit becomes -inf. Tokens >= 32 * mask_words are refused.
//   logits [rows][row_stride] in place; mask uint [rows][mask_stride], a row's first
//   mask_words words used (a row with no grammar: all bits set).
// One thread per (token, row): dispatch at least (n, rows) threads (extra ones return), any
// threadgroup width (MQ_TOKEN_MASK_THREADS); a SIMD-group of 32 consecutive tokens shares one
// mask word. Rows of several sequences (a shared step) go in one dispatch, a mask row each.
// A separate dispatch rather than a mask read folded into the choice kernels: it costs one
// dispatch, n / 8 bytes read and the refused tokens' 4-byte writes per row (<= 1 MB on a
// 248320 vocabulary, microseconds); folded in, each of the sampler's 2-12 passes over the row
// would read the mask, and argmax, the sampler and its draft mode would all change.
#define MQ_TOKEN_MASK_THREADS 256
struct TokenMaskParams {
  uint n;            // vocabulary size (logit entries per row)
  uint row_stride;   // floats between rows of logits (>= n)
  uint mask_words;   // words of a row's mask in use: ceil(n_mask / 32), n_mask the grammar's vocabulary
  uint mask_stride;  // words between rows of mask (>= mask_words)
};

// logit_bias: adds one sequence's (token, bias) pairs to each of its rows (a decode row, or
// its verify rows alike): logits[r][token] += bias. The choice kernels take one sequence per
// dispatch (their params are per request), so does this one: bind logits at the sequence's
// first row.
//   logits [rows][row_stride] in place; entries uint2 [MQ_LOGIT_BIAS_MAX]: (token id,
//   as_type<uint>(bias)); an unused entry has token id >= n (skipped). The token ids are
//   distinct (the host merges duplicates; OpenAI's logit_bias is a map).
// One thread per (entry, row): dispatch at least (MQ_LOGIT_BIAS_MAX, rows) threads (extra return).
// OpenAI's bound on logit_bias entries (bias in [-100, 100]).
#define MQ_LOGIT_BIAS_MAX 300
struct LogitBiasParams {
  uint n;           // vocabulary size
  uint row_stride;  // floats between rows of logits (>= n)
};
