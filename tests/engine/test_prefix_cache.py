"""The prefix cache for the hybrid state: snapshots taken inside prefill, restored after
other sequences ran, give exactly a cold run's logits; the LRU stays within its budget; a
chat whose template drops old thinking still hits at the last user turn."""

from __future__ import annotations

import numpy as np
import pytest

import metalqwen
from metalqwen.prefix_cache import PrefixCache

# Long tests sharing only session fixtures: xdist may give each to a free worker.
pytestmark = pytest.mark.spread


def _ids(n: int, seed: int, vocab: int = 1000) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


# Positions one token in, inside a chunk, at a chunk's end, and after a short tail; the f16 cache
# differs from q8 only in the rows a snapshot copies, so two of them cover it.
@pytest.mark.parametrize("kv_bits, positions", [(8, [1, 5, 19, 32, 39]), (16, [5, 39])])
def test_a_restored_snapshot_resumes_with_a_cold_runs_logits_exactly(demo, device, kv_bits, positions):
    m = metalqwen.load(demo, device=device, max_context=64, prefill_chunk=8, kv_bits=kv_bits, progress=False)
    engine, a, b = m._engine, _ids(40, 1), _ids(40, 2)
    cold = engine.prefill(0, a, logits="all")
    engine.reset(0)
    snaps = []
    engine.prefill(0, a[:39], snapshot_at=positions, snapshots=snaps)
    assert [s.position for s in snaps] == positions and all(s.nbytes > 0 for s in snaps)
    for s in snaps:
        engine.reset(0)
        engine.prefill(0, b)  # another sequence overwrites every cache row and state
        engine.restore(0, s)
        assert engine.position(0) == s.position and engine.tokens(0) == a[: s.position]
        resumed = engine.prefill(0, a[s.position:], logits="all")
        assert np.array_equal(resumed, cold[s.position:]), f"resumed at {s.position}"


def test_moe_snapshots_resume_exactly(converted, device):
    m = metalqwen.load(converted("moe")[1], device=device, max_context=128, prefill_chunk=16, kv_bits=16,
                       progress=False)
    engine, a = m._engine, _ids(60, 3, m.config.vocab_size)
    cold = engine.prefill(0, a, logits="all")
    engine.reset(0)
    snaps = []
    engine.prefill(0, a[:45], snapshot_at=[7, 45], snapshots=snaps)
    for s in snaps:
        engine.reset(0)
        engine.prefill(0, _ids(30, 4, m.config.vocab_size))
        engine.restore(0, s)
        assert np.array_equal(engine.prefill(0, a[s.position:], logits="all"), cold[s.position:])


def test_snapshot_errors(demo, device):
    m = metalqwen.load(demo, device=device, max_context=64, progress=False)
    other = metalqwen.load(demo, device=device, max_context=64, progress=False)
    snaps = []
    m._engine.prefill(0, [1, 2, 3, 4], snapshot_at=[2], snapshots=snaps)
    with pytest.raises(metalqwen.EngineError, match="only be restored by the engine that took it"):
        other._engine.restore(0, snaps[0])
    with pytest.raises(metalqwen.EngineError, match="snapshot positions must ascend"):
        m._engine.prefill(0, [5, 6], snapshot_at=[3])  # at or before the current position


def test_the_lru_stays_within_its_budget(demo, device):
    m = metalqwen.load(demo, device=device, max_context=64, prefix_cache_bytes=1, progress=False)
    snaps = []
    m._engine.prefill(0, _ids(30, 5), snapshot_at=[10, 20, 30], snapshots=snaps)
    sizes = [s.nbytes for s in snaps]  # grow with the K/V rows held
    cache = PrefixCache(sizes[1] + sizes[2])  # room for the last two
    for s in snaps:
        cache.add(s)
    assert len(cache) == 2 and cache.bytes == sizes[1] + sizes[2] and cache.evictions == 1
    ids = _ids(30, 5) + [7]
    assert cache.longest(ids).position == 30
    assert cache.longest(ids[:20] + [9]).position == 20
    assert cache.longest(ids[:10] + [9]) is None, "the oldest entry was evicted"
    assert cache.longest(ids[:30]).position == 20, "only proper prefixes count"
    small = PrefixCache(sizes[0] - 1)
    small.add(snaps[0])
    assert len(small) == 0, "a snapshot larger than the whole budget is not kept"


def test_a_chat_that_drops_old_thinking_resumes_at_the_last_user_turn(demo, device):
    m = metalqwen.load(demo, device=device, max_context=512, prefix_cache_bytes=64 << 20, progress=False)
    t = m.tokenizer
    first = [{"role": "user", "content": "hi there"}]
    ids1 = t.encode_chat(first)
    end_of_user = len(t.encode(t.apply_chat_template(first, add_generation_prompt=False)))
    reply = m.generate(ids1, max_tokens=6, boundaries=[end_of_user])
    second = first + [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "and?"}]
    ids2 = t.encode_chat(second)
    assert ids2[: len(ids1)] != ids1, "the template re-renders the answer: the live state cannot be extended"
    m._engine.reset(0)  # only the prefix cache can help now
    again = m.generate(ids2, max_tokens=6)
    assert again.stats.prompt_tokens_reused == end_of_user
    cold = metalqwen.load(demo, device=device, max_context=512, progress=False)
    assert again.tokens == cold.generate(ids2, max_tokens=6).tokens
