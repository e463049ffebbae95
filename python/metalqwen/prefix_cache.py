"""The prefix cache: saved sequence states, found by the tokens that led to them.

Qwen3.5's DeltaNet state cannot be trimmed back to a shorter prefix, so a cache that
only keeps the latest sequence misses whenever a chat template re-renders history (Qwen's
drops the thinking of earlier answers). Instead the engine snapshots the whole state
(DeltaNet states, conv histories, attention K/V rows) at chosen positions — message
boundaries and the end of each prompt — and a later prompt resumes from the longest
snapshot whose tokens it starts with. Resuming gives exactly a cold run's logits (the
engine's prefill path computes each row independently of how the prompt was chunked).
A prompt with images is keyed with each image's content hash in its rows (images.py,
PreparedImages.cache_key): the pad ids alone do not say which picture they hold. With a
disk_cache.DiskCache the snapshots are also written to files, and a prompt resumes from one
when it covers more than memory does (after a restart, or once evicted from memory).
"""

from __future__ import annotations

from typing import Sequence

from .byte_lru import ByteLRU


def message_boundaries(tokenizer, messages: list[dict], ids: list[int], **template) -> list[int]:
    """Where the system prompt and the last user (or tool) turn end in ``ids`` (the chat
    ``messages`` rendered with ``template`` options): the points a next turn shares even when
    the template re-renders the answers after them, so the snapshots worth taking."""
    last = max((i for i, m in enumerate(messages) if m["role"] != "assistant"), default=None)
    ends = sorted({0 if messages[0]["role"] == "system" else None, last} - {None})
    found = []
    for i in ends:
        prefix = tokenizer.encode(tokenizer.apply_chat_template(messages[: i + 1], add_generation_prompt=False,
                                                                **template))
        if 0 < len(prefix) < len(ids) and ids[: len(prefix)] == prefix:
            found.append(len(prefix))
    return found


class PrefixCache:
    """Snapshots by token prefix, least recently used evicted beyond ``budget_bytes`` (0 with a
    ``disk``: snapshots on disk only)."""

    def __init__(self, budget_bytes: int, disk=None):
        self._lru = ByteLRU(budget_bytes)  # token prefix -> snapshot, counted as add says
        self.disk = disk  # disk_cache.DiskCache, or None

    @property
    def budget(self) -> int:
        return self._lru.budget

    @property
    def bytes(self) -> int:
        """Device memory the snapshots hold (as counted: see add)."""
        return self._lru.bytes

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    def __len__(self) -> int:
        return len(self._lru)

    def keys(self):
        """The keys held, least recently used first."""
        return self._lru.keys()

    def longest(self, ids: Sequence, longer_than: int = 0):
        """The snapshot of the longest proper prefix of ``ids`` held here, or None. ``ids``: token ids,
        or a prompt's images.PreparedImages.cache_key(). The disk is read only for a prefix longer
        than both memory's and ``longer_than`` (what the caller has already)."""
        hit = None
        for position in sorted({len(k) for k in self._lru.keys() if len(k) < len(ids)}, reverse=True):
            hit = self._lru.get(tuple(ids[:position]))
            if hit is not None:
                break
        if self.disk is not None:
            loaded = self.disk.longest(ids, max(longer_than, hit.position if hit is not None else 0))
            if loaded is not None:
                self._lru.put(tuple(ids[:loaded.position]), loaded, loaded.nbytes)
                return loaded
        return hit

    def add(self, snapshot, key: Sequence | None = None, counted: int | None = None) -> None:
        """Keeps ``snapshot`` (a _core.Snapshot) under ``key`` (default its tokens; a prompt with images:
        its cache_key up to the snapshot), evicting the least recently used over budget. ``counted``:
        the bytes to count it as (default its own; a pipeline's ranks count the largest rank's part,
        so that every rank keeps and evicts the same keys)."""
        key = tuple(snapshot.tokens if key is None else key)
        if self._lru.get(key) is None:
            self._lru.put(key, snapshot, snapshot.nbytes if counted is None else int(counted))
            if self.disk is not None:
                self.disk.store(snapshot, key)
