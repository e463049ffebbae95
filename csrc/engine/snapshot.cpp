// Snapshots of the sequence state for the prefix cache: the DeltaNet recurrent state
// cannot be rewound, so a prompt can only resume where a full copy of the state was
// saved. The copies are dispatches (copy_u32) in the command buffer that reaches the
// position, so taking one costs no extra pass over the model.
#include <cstring>
#include <string>

#include "dflash.h"
#include "mtp.h"

namespace mq::engine {

std::vector<Engine::StateRegion> Engine::state_regions(int slot, int position) const {
  const size_t kv_dim = size_t(model_.dims.kv_heads) * MQ_ATTN_HEAD_DIM, p = size_t(position);
  const size_t ctx = size_t(options_.max_context);
  std::vector<const LayerWeights*> layers;
  for (const LayerWeights& l : layers_) layers.push_back(&l);
  if (mtp_) layers.push_back(&mtp_->layer);  // its K/V rows too: a resumed sequence drafts as a fed one does
  std::vector<StateRegion> regions;
  auto base = [slot](const SlotBuffer& b) { return size_t(slot) * b.slot_bytes; };  // the slot's part
  for (const LayerWeights* layer : layers) {
    const LayerWeights& l = *layer;
    if (!l.full_attention) {
      for (const SlotBuffer* b : {&l.state, &l.hist})
        regions.push_back({.buffer = b->buffer, .offset = base(*b), .bytes = b->slot_bytes});
      continue;
    }
    for (const SlotBuffer* cache : {&l.k_cache, &l.v_cache}) {
      // Rows [0, p) of each plane (params/attention.h): q8 codes and their f16 scales, or f16.
      if (options_.kv_bits == 8) {
        regions.push_back({.buffer = cache->buffer, .offset = base(*cache), .bytes = p * kv_dim});
        regions.push_back({.buffer = cache->buffer,
                           .offset = base(*cache) + ctx * kv_dim,
                           .bytes = p * kv_dim / MQ_ATTN_Q8_BLOCK * 2});
      } else {
        regions.push_back({.buffer = cache->buffer, .offset = base(*cache), .bytes = p * kv_dim * 2});
      }
    }
  }
  if (dflash_) {  // the drafter's context rows [0, p): a resumed sequence drafts as a fed one does
    const size_t row = size_t(dflash_->dims.kv_heads) * size_t(dflash_->dims.head_dim) * 4;
    for (const DflashLayer& l : dflash_->layers)
      for (const SlotBuffer* cache : {&l.k_cache, &l.v_cache})
        regions.push_back({.buffer = cache->buffer, .offset = base(*cache), .bytes = p * row});
  }
  return regions;
}

namespace {

// dst = src, `bytes` (a multiple of 4) as 32-bit words, by `copy` (copy_u32).
void encode_copy(Encoder& enc, const Pipeline& copy, const Arg& src, const Arg& dst, size_t bytes) {
  if (bytes == 0) return;
  const CopyParams p{
      .cols = uint32_t(bytes / 4), .rows = 1, .src_offset = 0, .src_stride = 0, .dst_offset = 0, .dst_stride = 0};
  enc.dispatch_threads(copy, {src, dst, Arg::value(p)}, {p.cols, 1});
}

}  // namespace

std::shared_ptr<Snapshot> Engine::encode_snapshot(Encoder& enc, int slot, int position) {
  auto s = std::make_shared<Snapshot>();
  s->engine = this;
  s->position = position;
  s->rope_delta = sequences_[size_t(slot)].rope_delta;
  const auto* ids = host_ids(slot);
  s->tokens.assign(ids, ids + position);
  const auto regions = state_regions(slot, position);
  size_t total = 0;
  for (const StateRegion& r : regions) total += r.bytes;
  s->data = device_->new_buffer(std::max<size_t>(total, 4));
  size_t at = 0;
  for (const StateRegion& r : regions) {
    encode_copy(enc, *k_.copy_u32, Arg(r.buffer, r.offset), Arg(s->data, at), r.bytes);
    at += r.bytes;
  }
  return s;
}

void Engine::restore(int slot, const Snapshot& s) {
  Sequence& q = sequence(slot);
  if (s.engine != this) throw EngineError("[engine] a snapshot can only be restored by the engine that took it");
  decode_end();
  Encoder enc(*device_, kernels_, "restore");
  size_t at = 0;
  for (const StateRegion& r : state_regions(slot, s.position)) {
    encode_copy(enc, *k_.copy_u32, Arg(s.data, at), Arg(r.buffer, r.offset), r.bytes);
    at += r.bytes;
  }
  commit_and_wait(enc, "restore", slot);
  std::memcpy(host_ids(slot), s.tokens.data(), s.tokens.size() * 4);
  q.position = s.position;
  q.mtp_carry = false;
  q.rope_delta = s.rope_delta;
}

std::vector<std::pair<size_t, size_t>> Engine::snapshot_layout() const {
  const auto empty = state_regions(0, 0), one = state_regions(0, 1);
  std::vector<std::pair<size_t, size_t>> layout;
  for (size_t i = 0; i < empty.size(); ++i) layout.emplace_back(empty[i].bytes, one[i].bytes - empty[i].bytes);
  return layout;
}

std::shared_ptr<Snapshot> Engine::import_snapshot(int position, int rope_delta, const std::vector<uint32_t>& tokens,
                                                  const void* data, size_t bytes) {
  if (position < 1 || position > options_.max_context || tokens.size() != size_t(position))
    throw EngineError("[engine] a snapshot to import needs 1..max_context (" + std::to_string(options_.max_context) +
                      ") positions and one token id each, got position " + std::to_string(position) + " with " +
                      std::to_string(tokens.size()) + " ids");
  size_t total = 0;
  for (const StateRegion& r : state_regions(0, position)) total += r.bytes;
  if (bytes != total)
    throw EngineError("[engine] a snapshot at position " + std::to_string(position) + " holds " +
                      std::to_string(total) + " bytes of state here, the data to import has " + std::to_string(bytes));
  auto s = std::make_shared<Snapshot>();
  s->engine = this;
  s->position = position;
  s->rope_delta = rope_delta;
  s->tokens = tokens;
  s->data = device_->new_buffer(std::max<size_t>(total, 4));
  std::memcpy(s->data->contents(), data, bytes);
  return s;
}

}  // namespace mq::engine
