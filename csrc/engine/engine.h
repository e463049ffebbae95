// The Qwen3.5 engine: weights and caches on the device, one command buffer per step
// (decode | verify | shared step; a prefill chunk takes one per prefill_layers_per_buffer
// layers), token ids kept on the GPU.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../../shaders/params.h"
#include "errors.h"
#include "gpu/device.h"
#include "kernels.h"
#include "memory_budget.h"
#include "model_desc.h"
#include "weights.h"

namespace mq::engine {

struct Counters {
  uint64_t steps = 0;            // steps committed (prefill chunks, decode, verify and shared steps, restores)
  uint64_t command_buffers = 0;  // their command buffers (more than steps when prefill chunks are split)
  uint64_t failed_steps = 0;     // steps the GPU failed (their slots were reset)
  uint64_t dispatches = 0;       // over all steps
  uint64_t last_step_dispatches = 0;
  uint64_t barriers = 0;         // dependent dispatch boundaries, over all steps (Encoder::barriers)
  uint64_t last_step_barriers = 0;
  double host_encode_us = 0;     // host time encoding steps (Encoder::encoding_time), over all steps
  double last_step_host_encode_us = 0;
  uint64_t cpu_waits = 0;        // host waits for a step (for each of its command buffers in turn)
  uint64_t tokens_decoded = 0;   // decode steps
  uint64_t max_steps_in_flight = 0;  // decode or shared steps committed and not yet waited for (2 = pipelined)
  uint64_t pipelined_steps = 0;      // shared steps committed while another was in flight (Engine::step_commit)
  uint64_t weight_bytes = 0;            // the tensors placed on the device (the layer range's: keep_layer_range)
  uint64_t weight_bytes_per_token = 0;  // weights a decode step streams
  uint64_t weight_bytes_copied = 0;     // at load, read into arenas where the file could not be wrapped
  uint64_t weight_buffers = 0;          // device buffers holding the weights: wrapped spans and arenas per shard
  uint64_t load_rss_before = 0;         // process resident set before the weights were placed (Weights::rss_before)
  uint64_t load_peak_rss = 0;           // its peak while they were placed (Weights::peak_rss)
  uint64_t memory_estimate = 0;         // bytes the load was admitted with (weights + KV cache + workspace)
  uint64_t library_kernels = 0;         // kernel functions of the model's compiled library (Kernels::create)
  uint64_t library_source_bytes = 0;    // the MSL it was compiled from
  // Speculative decoding (Engine::verify).
  uint64_t verify_steps = 0;
  uint64_t drafted = 0, accepted = 0;                  // drafts fed to verify steps, and accepted
  std::vector<uint64_t> drafted_at, accepted_at;       // the same per draft depth (index 0 = first draft)
};

// How the next token is chosen on the GPU: penalties (when not neutral) on the logits,
// then greedy argmax at temperature 0, else temperature -> top-k -> top-p -> min-p and a
// seeded draw (shaders/sampling.metal). Neutral values dispatch nothing extra.
struct Sampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;    // over the tokens generated since the last prefill
  float frequency_penalty = 0.0f;   // likewise, times each token's count
  float repetition_penalty = 1.0f;  // over the whole context (prompt + generated)
  uint64_t seed = 0;
  // Log-probabilities of each chosen token over the raw logits (Engine::last_logprobs):
  // -1 = off (no dispatch), 0 = the chosen token's only, N <= MQ_LOGPROB_MAX_TOP = and the top N.
  // Under a token mask the raw row is the masked one (refused tokens -inf), as vLLM reports.
  int logprobs = -1;
  // OpenAI's logit_bias: (token id, bias) pairs, ids distinct and < vocab, at most
  // MQ_LOGIT_BIAS_MAX, added to the logits before the penalties (vLLM's order).
  std::vector<std::pair<uint32_t, float>> logit_bias;
  // The choice reads the slot's row of the token-mask buffer (Engine::token_masks), which the
  // host writes before the choice is encoded: refused tokens are -inf before anything else.
  // Prefill and step take it; decode steps (their masks depend on the token before) do not.
  bool token_mask = false;
  bool penalised() const { return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f; }
  // Biased or masked: chosen by encode_choice, one row, never with drafts.
  bool constrained() const { return token_mask || !logit_bias.empty(); }
};

// The log-probabilities of one chosen token (see Sampling::logprobs).
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<uint32_t, float>> top;  // (id, logprob), descending, ties lower id first
};

struct LayerWeights;
struct MtpWeights;
struct DflashWeights;
struct DflashLayer;
struct MlpWeights;
struct MoeWeights;
struct Workspace;

// The state after the first `position` tokens, saved aside: every DeltaNet state and
// conv history, and the attention K/V rows [0, position). Restoring it resumes exactly
// that sequence, whatever ran since (see snapshot.cpp).
struct Snapshot {
  const void* engine = nullptr;        // the engine that took it: only that one restores it
  int position = 0;
  int rope_delta = 0;                  // the sequence's rotary offset (Engine: PromptImages)
  std::vector<uint32_t> tokens;        // ids [0, position)
  std::shared_ptr<gpu::Buffer> data;   // the state regions back to back, in Engine::state_regions order
  size_t nbytes() const { return data ? data->size() : 0; }
};

// Load progress: weights placed (bytes), then kernels built (see Kernels::Progress).
struct LoadProgress {
  Weights::Progress weights;
  Kernels::Progress kernels;
};

// A prompt's images (docs/images.md): the rotary positions of its rows and the rows whose
// embeddings are the vision tower's features instead of the image-pad token's.
struct PromptImages {
  // int32 [tokens][3]: (time, height, width) rotary position of each row of the whole prompt, from
  // the sequence's row 0 (text rows all three equal); Qwen3.5's interleaved M-RoPE picks a
  // component per rotary pair. A prefill or prompt chunk feeds some of these rows, in order.
  std::vector<int32_t> rope_positions;
  // Rows [first, first + rows) of the prompt (0 = its first token) take f32 [rows][hidden]
  // from `features` (at byte `offset`, e.g. the tower's output buffer) as their embeddings.
  struct Features {
    uint32_t first = 0, rows = 0;
    std::shared_ptr<gpu::Buffer> features;
    size_t offset = 0;
  };
  std::vector<Features> features;
};

// Called after each prefill chunk is committed with (tokens submitted, tokens in all); an
// exception it throws (e.g. an interrupt) stops the prefill after the chunks submitted.
using PrefillProgress = std::function<void(size_t done, size_t total)>;

// The command buffers of one committed step, in commit order.
using Submitted = std::vector<std::unique_ptr<gpu::CommandBuffer>>;

// GPU failures: when a step's command buffer fails (and with it the buffers queued behind
// it), the call that waits for it resets every slot the step ran in (state cleared, position
// 0, penalty counts cleared: its tokens are gone) and throws gpu::GpuError naming the step
// kind and the slots, with the device's message (the failing buffer's label; on Metal each
// encoder's state). The error is thrown once; the next call works from the reset state.
// What one forward pass encodes (forward.cpp): the rows of one or more sequence slots, the
// kernels they take and which logits they leave. Each step kind builds its own.
struct ForwardPass {
  StepSegments segs{};  // rows by slot, in row order: a segment is a slot's rows from its position
  uint32_t rows = 0;    // every segment's rows
  // Matvec / flash-decode kernels (the weights stream once for all rows: decode, verify and shared
  // steps), else GEMM / prefill attention, whose per-row results do not depend on the other rows
  // of the chunk: so a prompt resumed from a snapshot gets a cold run's logits exactly.
  bool matvec = false;
  uint32_t snapshot_rows = 0;  // DeltaNet states kept after each segment's rows [0, snapshot_rows) (verify rollback)
  uint32_t logit_row0 = 0;     // logits of rows [logit_row0, rows) into the logits buffer; rows: none
  bool split_layers = false;   // a command buffer per prefill_layers_per_buffer layers (prefill chunks)
  // Prefill rows with images (PromptImages): int [rows][3] rotary positions of the rows (null:
  // cache row + the slot's rope_delta), and rows of x whose embeddings are replaced after embed.
  Arg rope_positions{nullptr};
  struct EmbedRows {
    uint32_t row, rows;  // x rows [row, row + rows)
    Arg src;             // f32 [rows][hidden]
  };
  std::vector<EmbedRows> embed_rows;
  // `rows` rows of `slot` from `position`.
  static ForwardPass one_slot(int slot, int position, uint32_t rows, bool matvec);
};

class Engine {
 public:
  Engine(std::shared_ptr<gpu::Device> device, ModelDesc model, EngineOptions options,
         const LoadProgress& progress = {});
  ~Engine();

  // Sequence slots (EngineOptions::max_sequences): every call names the slot it works on, whose
  // KV caches, DeltaNet state, token ids and position are its own; the others keep theirs. A call
  // that runs a step (or resets) ends a decode in progress and waits for the shared steps in
  // flight first (decode_end).
  int max_sequences() const { return options_.max_sequences; }
  int max_context() const { return options_.max_context; }
  const ModelDims& dims() const { return model_.dims; }

  // Forgets every token of `slot`: position 0, its recurrent state cleared.
  void reset(int slot);
  int position(int slot) const { return sequence(slot).position; }
  // Token ids fed so far (positions 0 .. position(slot)-1).
  std::vector<uint32_t> tokens(int slot) const;
  // The token chosen last and not yet fed (ids[position(slot)]), e.g. by prefill.
  uint32_t chosen(int slot) const;

  // Runs `tokens` from the slot's position in prefill chunks, then chooses the next token on the
  // GPU (ids[position]). Returns logits [tokens.size()][vocab] when `all_logits`, else the last
  // row's logits when `last_logits`, else nothing. Throws ContextFull (before running anything)
  // when the tokens and the chosen one do not fit. When `progress` throws, the chunks already
  // submitted stay fed (position() tells). `snapshot_at`: absolute positions in (position(),
  // position() + tokens.size()], ascending, after which the state is saved into `snapshots` by
  // the chunk that ends there. A chunk the GPU fails resets the slot (see GPU failures) and takes
  // this call's snapshots back out. `images`: the whole prompt's rotary positions and image
  // features (rows from 0: `tokens` are its rows [position(), position() + tokens.size())). The
  // slot's rope_delta becomes that of its rows so far, largest rotary position + 1 - position()
  // (a snapshot's too); text rows after the prompt rotate at cache row + it (until reset).
  // `next_token`: the prompt's token after `tokens`, fed by a later call (a pipeline rank feeds a
  // prompt a chunk per call): written at ids[end] and nothing chosen, so the MTP head's last row
  // pairs with it as in a whole prompt's prefill.
  std::vector<float> prefill(int slot, const std::vector<uint32_t>& tokens, const Sampling& sampling, bool all_logits,
                             bool last_logits, const PrefillProgress& progress = {},
                             const std::vector<int>& snapshot_at = {},
                             std::vector<std::shared_ptr<Snapshot>>* snapshots = nullptr,
                             const PromptImages* images = nullptr, std::optional<uint32_t> next_token = {});
  // The slot's rotary offset: rotary position - cache row of its text rows (0 without images).
  int rope_delta(int slot) const { return sequence(slot).rope_delta; }
  // Puts a snapshot's state into `slot` (any slot: the parts are alike): position() and
  // tokens() become the snapshot's.
  void restore(int slot, const Snapshot& snapshot);
  // How a snapshot's bytes are laid out: per state region, in order, (bytes, bytes per row): one
  // at position p holds the sum of bytes + p * per row. The disk cache keys its files by it.
  std::vector<std::pair<size_t, size_t>> snapshot_layout() const;
  // A snapshot of this engine from a copy of another one's data (the disk cache's files): `data`
  // must hold exactly a snapshot at `position` of this layout, `tokens` its ids; EngineError else.
  std::shared_ptr<Snapshot> import_snapshot(int position, int rope_delta, const std::vector<uint32_t>& tokens,
                                            const void* data, size_t bytes);

  // Token-by-token decoding of `slot` from the token prefill chose: decode_begin, then
  // decode_next until it returns nothing (after max_tokens) or the caller stops, then
  // decode_end. Step k+1 is committed before step k is waited for (its input id is read on the
  // GPU), so the GPU never waits for the CPU. After decode_end the state holds every returned
  // token but possibly the last (tokens() tells). decode_end also waits for shared steps in flight.
  // A token mask (Sampling::token_mask) only with max_tokens 2: its one step reads the slot's
  // token_masks row as the host wrote it before decode_begin.
  void decode_begin(int slot, int max_tokens, const Sampling& sampling);
  std::optional<uint32_t> decode_next();
  void decode_end();
  // The log-probabilities of the token decode_next (or step) returned last for `slot`, when its
  // sampling asked for them (Sampling::logprobs >= 0); nothing otherwise.
  std::optional<TokenLogprobs> last_logprobs(int slot) const;

  // Speculative decoding (options.max_draft > 0): one verify step feeds the chosen token
  // (ids[position()]) and `drafts` (at most max_draft) as 1 + drafts rows on the matvec path,
  // snapshotting every DeltaNet state per row. On the GPU it then chooses a token per row as
  // `sampling` would (argmax; or, sampling, speculative sampling with the drafts as point
  // masses: shaders/params/sampling.h), accepts the longest prefix of drafts that equal the
  // choices, restores the DeltaNet state after the last accepted row, and leaves the first
  // choice not accepted at ids[position()] for the next step. One CPU wait. Returns the
  // accepted drafts followed by that token (position() advances past the drafts and the token
  // fed first). Attention K/V rows past it are stale and rewritten by later steps. Greedy
  // output equals decode's token for token; sampled output has decode's distribution.
  // No penalties (a draft would change the counts of the rows after it).
  std::vector<uint32_t> verify(int slot, const std::vector<uint32_t>& drafts, const Sampling& sampling);
  // The same with `drafts` drafts (at most max_draft) made on the GPU by the MTP head in the
  // same command buffer: greedy chained drafts from the head's state for the row that chose
  // ids[position()] (point masses, so sampling stays exact). With the head loaded, every
  // verify step also runs it over its rows, which is how that state exists; after a plain
  // decode step or a restore it does not, and this step drafts nothing.
  std::vector<uint32_t> verify_mtp(int slot, uint32_t drafts, const Sampling& sampling);
  // Pipeline parallelism: the head's engine runs verify (its input rows in residual_rows());
  // the others run verify_rows (the same rows over their layers, DeltaNet states snapshotted,
  // the residual rows left for the next engine), then verify_accept with the head's result:
  // their states rolled back to `accepted` drafts, `next` at ids[position()] after them.
  void verify_rows(int slot, const std::vector<uint32_t>& drafts);
  void verify_accept(int slot, uint32_t drafts, uint32_t accepted, uint32_t next);
  // The MTP head's next `drafts` drafts (at most max_draft, within the context) for the slot, as
  // verify_mtp would make them, in a step of their own (written to ids after position(), not
  // fed); none without the head's state (mtp_ready). A pipeline's last engine drafts so, after
  // its step, for the first engine to feed them as host drafts of the next (verify, verify_rows;
  // a shared step's MTP entry, see SlotStep).
  std::vector<uint32_t> mtp_drafts(int slot, uint32_t drafts);
  // The same with `drafts` drafts (at most max_draft) made on the GPU by the DFlash drafter in the
  // same command buffer: its greedy block of drafts + 1 rows at position() (point masses).
  std::vector<uint32_t> verify_dflash(int slot, uint32_t drafts, const Sampling& sampling);
  // Several slots in one step: slot `slot` feeds its chosen token (ids[position()]) and `drafts`
  // (at most max_draft; none with penalties or logprobs) as rows of one matvec step, all slots'
  // rows together at most max_step_rows(), each at its own position. Each slot then chooses,
  // accepts and rolls back as its own verify step would (or, with penalties or logprobs, as a
  // decode step), so its tokens are the ones it gets alone. One CPU wait. Returns per entry the
  // accepted drafts followed by the next token. Every listed slot must hold a prefilled sequence.
  //
  // Slots whose sampling has token_mask (no drafts) are chosen in a second command buffer:
  // the first (the forward pass and the other slots' choices) is committed, then
  // `before_choice` runs on the host while the GPU runs it (it writes those slots' rows of
  // token_masks), then the masked choices are committed. An exception from before_choice
  // resets every slot of the step (their states hold the fed rows) and propagates.
  //
  // step = step_commit + step_wait. Pipelined shared steps, as decode steps: step_commit encodes
  // and commits the step and returns at once; each slot's row reads the id the GPU chose for it
  // (ids[position()]), so the next step can be committed while this one runs, and step_wait
  // waits for the oldest step committed and returns its tokens as step does. A step without
  // drafts advances its slots' positions when committed (tokens() counts the row it feeds; the
  // id it chooses is written by the GPU: read tokens() and chosen() once it is waited for); a
  // step with drafts when waited for (the GPU decides how many are accepted), so while one is in
  // flight nothing more is committed. Drafts and token masks are refused while steps are in
  // flight (their rows or masks are host decisions that need the tokens before). Every other
  // call that runs a step or resets (and step itself) first waits for the steps in flight, as
  // decode_end does; their tokens stay fed (tokens() tells).
  //
  // `mtp_drafts` (with the head loaded; instead of `drafts`, at most max_draft): the slot's
  // drafts are made on the GPU by the MTP head in the step's command buffer, as verify_mtp's,
  // when its state exists (mtp_ready), else the slot feeds one row. A step with such an entry
  // runs the head over all its rows afterwards, which gives every slot of the step that state.
  // Or the host gives them in `drafts` (mtp_drafts of them, the first of those mtp_drafts() made
  // after the slot's step before, with the state): how a pipeline's last engine takes them.
  struct SlotStep {
    int slot = 0;
    std::vector<uint32_t> drafts;
    Sampling sampling;
    uint32_t mtp_drafts = 0;
  };
  using BeforeChoice = std::function<void()>;
  // A joining prompt's chunk as rows of a shared step (chunked prefill): its rows run on the
  // prefill (GEMM) path before the slots' rows on the matvec path, two forward passes back to
  // back in the step's command buffer, so every row computes exactly as alone (the chunk as
  // prefill's chunk of the same boundaries). Its layers split into command buffers as prefill's
  // do (prefill_layers_per_buffer); the last one also holds the slots' rows. The slot holds the
  // prompt's earlier chunks (or nothing). `last`: the prompt's last chunk, which chooses its
  // first token (step's result gets one more entry after the slots': that token, or nothing for
  // an earlier chunk). `snapshot`: the state at the chunk's end is copied for the prefix cache
  // (into step's `snapshots` once waited for). At most max_rows() tokens; step only (a host
  // decision: nothing is in flight around it). `images`: a prompt with images' rotary positions
  // and features, as prefill takes them (the whole prompt's).
  struct PromptChunk {
    int slot = 0;
    std::vector<uint32_t> tokens;
    Sampling sampling;
    bool last = false;
    bool snapshot = false;
    const PromptImages* images = nullptr;
  };
  std::vector<std::vector<uint32_t>> step(const std::vector<SlotStep>& steps, const BeforeChoice& before_choice = {},
                                          const PromptChunk* prompt = nullptr,
                                          std::vector<std::shared_ptr<Snapshot>>* snapshots = nullptr);
  void step_commit(const std::vector<SlotStep>& steps, const BeforeChoice& before_choice = {});
  std::vector<std::vector<uint32_t>> step_wait();
  // Shared steps committed and not yet waited for.
  int steps_in_flight() const { return decoding_ ? 0 : int(in_flight_.size()); }

  // Grammar token masks, written by the host: uint [max_sequences][mask_words()], slot s's
  // row read by its masked choices (bit t % 32 of word t / 32 set = token t allowed; see
  // shaders/params/sampling.h token_mask). Shared memory: write it only between steps, or in
  // step's before_choice.
  uint32_t* token_masks() const;
  uint32_t mask_words() const { return (uint32_t(model_.dims.vocab) + 31) / 32; }

  // Pipeline parallelism (EngineOptions::first_layer, end_layer): an engine of a layer range runs
  // the same steps over its layers only. One that does not embed takes its input rows in
  // residual_rows(), written by the host before the step; one without the head leaves the
  // residual stream after its last layer there (x + that layer's MLP output, as the next layer's
  // input norm would add them) and chooses nothing: the host gives every such engine the head's
  // choice with set_chosen. Prefill takes at most max_rows() tokens per call and decode_begin
  // one step (max_tokens 2) then, since each step waits for rows from another engine; verify
  // with host drafts runs on the head's engine (verify_rows and verify_accept on the others);
  // the MTP head goes with the head (the embedding too, then), drafting with mtp_drafts.
  // A shared step (step, with several slots) takes its rows in step_rows() instead, the head's
  // engine chooses and accepts as alone, and every other engine then takes the head's outcome
  // with step_accept; drafts are the host's (the head's engine takes MTP entries with the
  // head's drafts made ahead, see SlotStep), and no step_commit: each step waits for the rows
  // of the engine before.
  bool embeds() const { return range_.first == 0; }
  bool has_head() const { return range_.end == model_.dims.layers; }
  LayerRange layers() const { return range_; }
  // [max_rows()][hidden] f32: the current residual stream; valid between steps.
  float* residual_rows() const;
  // [max_step_rows() + max_rows()][hidden] f32, engines of a layer range with max_sequences > 1:
  // a shared step's rows in its order (each entry's 1 + drafts rows, then the prompt chunk's),
  // read by a step of an engine that does not embed, written by one without the head; valid
  // between steps. GPU copies move them to and from the residual stream around each pass.
  float* step_rows() const;
  uint32_t step_rows_count() const;
  // The head's outcome of the last shared step, on an engine without the head (whose step chose
  // nothing and returned empty lists): per entry, in the step's order, (slot, drafts accepted,
  // next token); the DeltaNet states of slots with drafts rolled back in one command buffer,
  // positions past the accepted drafts, `next` at ids[position()]. `prompt_token`: the first
  // token the head chose after the step's last prompt chunk (none for an earlier chunk).
  struct SlotOutcome {
    int slot = 0;
    uint32_t accepted = 0, next = 0;
  };
  void step_accept(const std::vector<SlotOutcome>& outcomes, std::optional<uint32_t> prompt_token = {});
  uint32_t max_rows() const;
  // Rows of one verify or shared step (drafts included): 8, or 17 when max_draft exceeds 7.
  uint32_t max_step_rows() const;
  // ids[position(slot)] = id: the token the head chose (it is the next step's input).
  void set_chosen(int slot, uint32_t id);

  const Counters& counters() const { return counters_; }
  // The model's pipelines (bench/ records a step's dispatches through them).
  Kernels& kernels() { return kernels_; }

  // MTP head (mtp.cpp), loaded with EngineOptions::mtp. mtp_logits: from a fresh state of
  // `slot`, logits [ids.size() - 1][vocab], row t predicting ids[t + 2] from the trunk's h[t]
  // and ids[t + 1] with the MTP cache holding rows 0..t; the slot is reset afterwards.
  bool has_mtp() const { return mtp_ != nullptr; }
  // Whether the head's state for the slot's next drafts exists (see verify_mtp and step).
  bool mtp_ready(int slot) const { return sequence(slot).mtp_carry; }
  std::vector<float> mtp_logits(int slot, const std::vector<uint32_t>& ids);

  // DFlash drafter (dflash.cpp, math in dflash.h), loaded when the description has one
  // (ModelDesc::drafter): every forward pass also captures the target's residual stream after
  // the drafter's target layers (in its own command buffer, no extra pass) and projects those
  // rows into the drafter's context caches at their slots and positions.
  bool has_dflash() const { return dflash_ != nullptr; }
  // The last pass's captured rows, f32 [rows][n * hidden] (column block i: layer
  // target_layer_ids[i]); valid between steps.
  std::vector<float> dflash_hidden(uint32_t rows) const;
  // One drafter pass over a block of k + 1 rows at position(slot): the chosen token, then mask
  // tokens. Writes its k greedy drafts to ids[position + 1 ..] (not fed: position() stays) and
  // returns their logits [k][vocab].
  std::vector<float> dflash_block(int slot, uint32_t k);

 private:
  // ---- sequence slots (sequences.cpp, speculative.cpp, batch.cpp, snapshot.cpp)
  // A sequence slot's host-side state (its device state lives in the slot parts of the buffers).
  struct Sequence {
    int position = 0;
    int generated_from = 0;  // end of the last prefill: positions from here on were generated
    // ws_->mtp_carry holds the MTP head's output for the pair that predicted ids[position + 1]
    // (its logits draft the next step); false when the last step did not run the head.
    bool mtp_carry = false;
    // Where in ids the token returned last sits, when its logprobs were asked for (else -1).
    int logprob_position = -1;
    // What the slot's logit_bias table holds (write_logit_bias): written once per request, not
    // per step, so the steps in flight read it undisturbed.
    std::vector<std::pair<uint32_t, float>> logit_bias;
    // Rotary position - cache row of the rows after the last prefill with images (PromptImages).
    int rope_delta = 0;
  };
  // The slot's sequence; EngineError unless `slot` is one of the slots reserved at load
  // (`caller` prefixes the message, e.g. "step: ").
  Sequence& sequence(int slot, const std::string& caller = "");
  const Sequence& sequence(int slot, const std::string& caller = "") const;
  // ContextFull unless `extra` more positions fit `q`; `caller` prefixes the message, e.g. "step: slot 2: ".
  void check_room(size_t extra, const Sequence& q, const std::string& caller = "") const;
  void check_sampling(const Sampling& sampling) const;
  // EngineError naming `what` unless this engine runs every layer.
  void check_whole(const std::string& what) const;
  void check_slot_step(const SlotStep& s, uint32_t rows_before) const;
  // The drafts a step entry feeds: its host drafts, or its MTP drafts when the head's state exists.
  uint32_t step_drafts(const SlotStep& s) const;
  // EngineError unless `images` fits a prompt of `tokens` tokens and this model's hidden size.
  void check_images(const PromptImages& images, const Sequence& q, size_t tokens, const std::string& where) const;
  // Binds the image rows [first, first + rows) of a prompt's pass (and its MTP head's) and uploads
  // their rotary positions; sets q's rope_delta to that of its rows up to first + rows.
  std::shared_ptr<gpu::Buffer> bind_images(const PromptImages& images, Sequence& q, uint32_t first, uint32_t rows,
                                           ForwardPass& pass, ForwardPass& head);
  // The embed rows of pass rows [0, rows) = prompt rows [first, first + rows) that hold image features.
  std::vector<ForwardPass::EmbedRows> image_rows(const PromptImages& images, uint32_t first, uint32_t rows);
  // A slot's token ids (uint [max_context + 1]) on the device and for the host.
  Arg ids(int slot) const;
  uint32_t* host_ids(int slot) const;
  void commit_decode_step();
  // A step committed and not yet waited for (a decode step or a shared step), oldest first in
  // in_flight_: later steps queue behind it on the GPU and read the ids it chooses there.
  struct InFlight {
    Submitted buffers;
    std::string kind;  // "decode step" | "shared step": names it when it fails
    StepSegments segs{};  // its slots' rows, each segment from the position it fed first
    std::vector<int> logprobs;  // per segment: its Sampling::logprobs
    // Per segment: its index among the verified segments (ws_->accepted), else MQ_MAX_SEGMENTS.
    std::vector<uint32_t> verified_index;
    bool speculative = false;  // with drafts: positions advance by the accepted ones when waited for
    int prompt_slot = -1;  // a prompt chunk's slot (Engine::PromptChunk), else -1
    std::shared_ptr<Snapshot> snapshot;  // the state at the chunk's end, when asked
    std::shared_ptr<gpu::Buffer> rope_positions;  // a prompt chunk's with images, int32 [rows][3]
    // Every slot whose rows it holds.
    std::vector<int> slots() const;
  };
  // A range engine's shared step waiting for step_accept: its segments (each entry's rows), and
  // the slot of its last prompt chunk (-1: none).
  struct Unaccepted {
    StepSegments segs{};
    int prompt_slot = -1;
  };
  // step_rows rows [row, row + rows) into x rows [0, rows) (`into_x`), or x's back there.
  void encode_step_rows(Encoder& enc, uint32_t row, uint32_t rows, bool into_x);
  // step_commit with a prompt chunk's rows first (null: none).
  void commit_shared_step(const std::vector<SlotStep>& steps, const BeforeChoice& before_choice,
                          const PromptChunk* prompt);
  // EngineError unless `prompt` fits its slot (not among `steps`), max_rows() and the vocabulary.
  void check_prompt_chunk(const PromptChunk& prompt, const std::vector<SlotStep>& steps) const;
  // The chunk's forward pass (prefill path), its choice when last, MTP rows and snapshot into `enc`;
  // advances its slot's position. `io_row`: its first row in step_rows (engines of a layer range).
  void encode_prompt_chunk(Encoder& enc, const PromptChunk& prompt, InFlight& f, uint32_t io_row);
  // One prompt chunk's GPU work (`pass`: one slot's rows, its ids in place; `head`: the MTP
  // head's positions and features): the layers, the last chunk's choice, the head's rows.
  // Prefill and a shared step's prompt chunk both encode it, so the two compute alike.
  void encode_prefill_rows(Encoder& enc, const ForwardPass& pass, const ForwardPass& head, bool last,
                           const Sampling& sampling);
  // Queues a committed step (the in-flight counters count it).
  void push_in_flight(InFlight step);
  // Waits for the oldest step in flight and takes it out; on a GPU failure resets the slots of
  // every step in flight (all queued behind it) and throws their GpuError.
  InFlight wait_oldest();
  // A waited shared step's tokens per segment (accepted drafts, then the next token); advances
  // the positions by the accepted drafts.
  std::vector<std::vector<uint32_t>> finish_shared_step(const InFlight& step);
  // A verify step of k drafts at the slot's position: `host_drafts`, or the MTP head's when null;
  // returns the accepted drafts and the next token.
  std::vector<uint32_t> run_verify(int slot, uint32_t k, const Sampling& sampling,
                                   const std::vector<uint32_t>* host_drafts);
  // The counters of a verified segment: `drafted` drafts, `accepted` of them taken.
  void count_verified(uint32_t drafted, uint32_t accepted);
  // Where the state of `slot` after `position` tokens lives: (buffer, byte offset, bytes) regions.
  struct StateRegion {
    std::shared_ptr<gpu::Buffer> buffer;
    size_t offset, bytes;
  };
  std::vector<StateRegion> state_regions(int slot, int position) const;
  // Copies the state of `slot` after `position` tokens (what `enc` leaves) into a new snapshot.
  std::shared_ptr<Snapshot> encode_snapshot(Encoder& enc, int slot, int position);

  // ---- committing steps (engine.cpp)
  Submitted commit(Encoder& enc);
  // Waits for each buffer of the step in order; throws the first failure's GpuError.
  void wait(Submitted& step);
  // Waits for a step whose failure is already being handled (errors ignored).
  static void drain(Submitted& step);
  // After a failed wait: ends a decode in progress (its steps drained), resets `slots` (see
  // GPU failures above) and returns the GpuError to throw: `kind` (e.g. "decode step"), the
  // slots, then `cause`'s message.
  gpu::GpuError step_failed(const std::string& kind, const std::vector<int>& slots, const gpu::GpuError& cause);
  // Commits `enc` and waits for it: one CPU wait; a failure resets `slot` (step_failed, `kind`).
  void commit_and_wait(Encoder& enc, const std::string& kind, int slot);

  // ---- the forward pass (forward.cpp, mlp.cpp, projections.cpp)
  // Every kernel a step may dispatch for this model, with its threadgroup needs, into the
  // slots (k_, each layer's and projection's kernels) the plan fills at load (pipelines.cpp).
  void plan_kernels(KernelPlan& plan);
  void plan_layer_kernels(KernelPlan& plan, LayerWeights& layer);
  // The model over the pass's rows (each segment at its slot's ids and positions): the logits
  // its logit_row0 asks for into the logits buffer; x left holding the final residual stream.
  void encode_forward(Encoder& enc, const ForwardPass& pass);
  // out [rows][hidden] = the embeddings of ids[first .. first + rows) (a slot's ids).
  void encode_embed(Encoder& enc, const Arg& ids, uint32_t first, uint32_t rows, const Arg& out, bool overlap = false);
  // out rows [e.row, e.row + e.rows) = e.src for each entry (image features over the embeddings).
  void encode_embed_rows(Encoder& enc, const std::vector<ForwardPass::EmbedRows>& rows, const Arg& out);
  // One decoder layer over the pass's rows: the residual stream x (+ mix, the previous layer's
  // output, when `add_mix`) in, its output in mix and x the stream before that output.
  void encode_layer(Encoder& enc, const ForwardPass& pass, const LayerWeights& layer, bool add_mix);
  // A norm: its weight and the pipeline of its separate dispatch (rms_norm or rms_norm_residual
  // in the weight's dtype), which prefill steps use; matvec steps fold it into the projections.
  struct Norm {
    const DeviceTensor& weight;
    const Pipeline& kernel;
  };
  // The mixers: input norm of x (+ mix) into their projections, their output into mix.
  void encode_deltanet(Encoder& enc, const ForwardPass& pass, const LayerWeights& layer, const Norm& input_norm,
                       bool add_mix);
  void encode_attention(Encoder& enc, const ForwardPass& pass, const LayerWeights& layer, const Norm& input_norm,
                        bool add_mix);
  // attn [rows][nq * head_dim] from q, k, v: flash-decode over each segment's cache (matvec
  // passes), or the prefill kernels over the one slot's cache.
  void encode_attention_decode(Encoder& enc, const ForwardPass& pass, const LayerWeights& layer);
  void encode_attention_prefill(Encoder& enc, const ForwardPass& pass, const LayerWeights& layer);
  // The MLP into mix: dense on xn, or with `post_norm` on rms(x + mix) * post_norm (the norm
  // fused where it can be); or the sparse MoE block (routing stays on the GPU).
  void encode_mlp(Encoder& enc, bool matvec, const MlpWeights& mlp, uint32_t rows, uint32_t intermediate,
                  const Norm* post_norm = nullptr);
  // act = silu(gate(u)) * up(u), u = rms(x + mix) * norm, in one matvec dispatch; with `writes_h`
  // it writes x + mix to x_next and u to xn too (the caller swaps x and x_next).
  void encode_normed_gate_up(Encoder& enc, const MlpWeights& mlp, const Norm& norm, uint32_t rows,
                             uint32_t intermediate, bool writes_h);
  void encode_moe_mlp(Encoder& enc, bool matvec, const MoeWeights& moe, const Norm& post_norm, uint32_t rows);
  // The MoE block of matvec steps in three barrier intervals (mlp.cpp), when each gate/up
  // pair (experts, shared expert) shares a format.
  void encode_moe_mlp_fused(Encoder& enc, const MoeWeights& moe, const Norm& post_norm, uint32_t rows);
  // y [rows][y_stride] = W x [rows][x_stride]: a matvec (weights streamed once) or a GEMM.
  void encode_projection(Encoder& enc, bool matvec, const QuantLinear& l, const Arg& x, uint32_t x_stride, const Arg& y,
                         uint32_t y_stride, uint32_t rows, bool overlap = false);
  // xn = rms(x) * w, after x += residual when asked (then the norm's kernel is rms_norm_residual's).
  void encode_norm(Encoder& enc, const Norm& norm, uint32_t rows, bool add_residual,
                   const std::shared_ptr<gpu::Buffer>& residual);
  // A projection reading the normed rows: its weights and where its output rows go.
  struct NormedOutput {
    const QuantLinear* l;
    Arg y;
    uint32_t y_stride;
  };
  // y = W (rms(x (+ mix)) * norm) for each member (projections.cpp); leaves x (+ mix) in x, the
  // normed rows in xn. `overlap`: no barrier before the first dispatch either (matvec steps).
  void encode_normed_projections(Encoder& enc, bool matvec, const Norm& norm, bool add_mix,
                                 std::initializer_list<NormedOutput> members, uint32_t rows, bool overlap = false);

  // ---- choosing tokens (choice.cpp, speculative.cpp)
  // The next token of `slot` from logits row `logit_row` as `sampling` says, into ids[out_pos]:
  // token mask (in place), logit_bias (on a copy), penalties, then argmax or the sampler.
  void encode_choice(Encoder& enc, int slot, uint32_t logit_row, const Sampling& sampling, uint32_t out_pos);
  // The slot's logit_bias table (ws_->logit_bias) from `sampling`, written before a step that reads it.
  void write_logit_bias(int slot, const Sampling& sampling);
  // A shared step's masked choices (segments `masked` of `segs`): the step so far committed,
  // before_choice run while the GPU runs it, then those choices (batch.cpp).
  void encode_masked_choices(Encoder& enc, const StepSegments& segs, const std::vector<Sampling>& samplings,
                             const std::vector<uint32_t>& masked, const BeforeChoice& before_choice);
  // out[out_pos + r] = argmax of logits row r, r < rows ([rows][vocab] from `logits`).
  void encode_argmax(Encoder& enc, const Arg& logits, uint32_t rows, const Arg& out, uint32_t out_pos);
  // The sampler's parameters for `s` over a vocab row: Philox `counter`, ids[out_pos] (decode), or
  // `drafts` rows in draft mode whose first samples position draft_pos (verify).
  SampleParams sample_params(const Sampling& s, uint32_t counter, uint32_t out_pos, uint32_t drafts,
                             uint32_t draft_pos) const;
  // The choices of verify segments (each with its sampling): one token per row of logits into
  // ws_->verify_chosen, then spec_accept per segment (ws_->accepted[i]) and the DeltaNet
  // rollbacks (see verify; speculative.cpp).
  void encode_verification(Encoder& enc, const StepSegments& segs, const std::vector<Sampling>& samplings);
  // Each segment with drafts rolls its DeltaNet states back to the row ws_->accepted[i] names (its
  // index i): one barrier before them all (they are independent). False: no segment has drafts.
  bool encode_rollbacks(Encoder& enc, const StepSegments& segs);

  // ---- MTP head (mtp.cpp, math in mtp.h)
  // For each segment's row r: the pair (row first_row + r of `hidden`, [rows][hidden_stride] f32,
  // and ids[position + 1 + r] of its slot, read on the GPU) at position + r; appends the slot's
  // MTP KV cache there; leaves the rows after mtp.norm in ws_->mtp_hidden [rows][hidden] (a
  // chained call's `hidden`, stride hidden) and the logits of rows [logit_row0, rows) in
  // ws_->logits rows [0, rows - logit_row0). Clobbers x, xn, mix and the layer scratch buffers
  // (never the trunk's caches/state).
  // `images`: the rows' rotary positions and image features over their embeddings (row r
  // embeds ids[position + 1 + r]), for prefill chunks of prompts with images.
  void encode_mtp(Encoder& enc, const StepSegments& segs, uint32_t rows, const Arg& hidden, uint32_t hidden_stride,
                  uint32_t logit_row0, const ForwardPass* images = nullptr);
  // The same for `rows` rows of one slot from `position`.
  void encode_mtp(Encoder& enc, int slot, uint32_t rows, int position, const Arg& hidden, uint32_t hidden_stride,
                  uint32_t logit_row0 = 0, const ForwardPass* images = nullptr);
  // lm_head over `rows` rows of `hidden` ([rows][hidden] f32) into ws_->logits rows [0, rows).
  void encode_mtp_logits(Encoder& enc, bool matvec, const Arg& hidden, uint32_t rows);
  // The prefill hook: after a chunk's trunk (and its choice), the chunk's rows through the head.
  void encode_mtp_prefill_chunk(Encoder& enc, int slot, uint32_t rows, const ForwardPass& head);
  // ids[position + 1 .. + k] of `slot` = the MTP head's greedy chain from its ws_->mtp_carry.
  void encode_mtp_drafts(Encoder& enc, int slot, int position, uint32_t k);
  // ids[position + rows] = 0 for each segment of a step the MTP head runs over (before commit).
  void write_head_tail(const StepSegments& segs);
  // Zeros the MTP cache rows of each segment's positions, fed by a step without the head.
  void encode_mtp_cache_gap(Encoder& enc, const StepSegments& segs);
  // ws_->mtp_carry of `slot` = ws_->mtp_hidden row `row` + the device word `accepted` (drafts
  // accepted, < planes) when given, else row `row`.
  void encode_mtp_carry(Encoder& enc, int slot, uint32_t row, const Arg* accepted, uint32_t planes, bool overlap);
  // The trunk state the head reads as h (EngineOptions::mtp_hidden), named once the trunk is encoded.
  Arg mtp_trunk_hidden() const;
  void load_mtp();

  // ---- DFlash drafter (dflash.cpp)
  void load_dflash();
  // After layers_[layer]: its output rows into the capture columns of each target id naming it.
  void encode_dflash_capture(Encoder& enc, const ForwardPass& pass, size_t layer);
  // The pass's captured rows -> fc, hidden_norm -> each draft layer's context K/V cache rows.
  void encode_dflash_context(Encoder& enc, const ForwardPass& pass);
  // A drafter block of `rows` rows at `position` of `slot`; drafts into ids[position + 1 ..].
  void encode_dflash_block(Encoder& enc, int slot, int position, uint32_t rows);
  // A draft layer's q/k norm + RoPE and K/V append (nq query heads: 0 for context rows only).
  void encode_dflash_prep(Encoder& enc, const DflashLayer& l, const StepSegments& segs, uint32_t nq, uint32_t rows);

  std::shared_ptr<gpu::Device> device_;
  ModelDesc model_;
  EngineOptions options_;
  LayerRange range_;  // the layers this engine runs (EngineOptions::first_layer, end_layer)
  MemoryNeeds memory_;  // checked before weights_ loads anything
  Weights weights_;
  Kernels kernels_;
  // The model-wide pipelines, resolved at load (plan_kernels); per-layer and per-format ones
  // live with their weights.
  struct StepKernels {
    const Pipeline *final_norm = nullptr, *silu_mul = nullptr, *copy_u32 = nullptr;
    const Pipeline *argmax_partial = nullptr, *argmax_final = nullptr, *sample = nullptr, *logprobs = nullptr;
    const Pipeline *penalty_count = nullptr, *penalty_apply = nullptr, *token_mask = nullptr, *logit_bias = nullptr;
    const Pipeline *spec_accept = nullptr, *delta_restore = nullptr;  // delta_restore: with max_draft > 0
    const Pipeline* attn_combine = nullptr;
    const Pipeline* residual_add = nullptr;  // engines without the head: x += mix after their last layer
    const Pipeline *moe_route = nullptr, *moe_group = nullptr, *moe_gather_rows = nullptr, *moe_combine = nullptr;
  } k_;
  std::vector<LayerWeights> layers_;
  // lm_head_ is embed_ when the embeddings are tied; each is empty when the layer range lacks it.
  QuantLinear embed_, lm_head_;
  DeviceTensor final_norm_;
  std::unique_ptr<MtpWeights> mtp_;  // null unless EngineOptions::mtp
  std::unique_ptr<DflashWeights> dflash_;  // null unless ModelDesc::drafter has layers
  std::unique_ptr<Workspace> ws_;
  std::vector<Sequence> sequences_;  // one per slot
  Counters counters_;

  struct Decoding {
    int slot = 0;
    Sampling sampling;
    int max_tokens = 0, returned = 0, committed = 0;
  };
  std::optional<Decoding> decoding_;  // a decode in progress: its steps are in_flight_
  std::deque<InFlight> in_flight_;
  std::optional<Unaccepted> unaccepted_;  // a range engine's shared step until step_accept
};

}  // namespace mq::engine
