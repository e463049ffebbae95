"""A least-recently-used map under a byte budget: the prefix cache's snapshots and the vision
tower's features are both kept this way (each entry counted as the bytes its owner says)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Iterator


class ByteLRU:
    """key -> value, each counted as ``size`` bytes; beyond ``budget`` bytes the least recently
    used go first. ``bytes``: what the entries count for; ``evictions``: entries dropped so far."""

    def __init__(self, budget: int):
        self.budget = int(budget)
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()  # key -> (value, size)
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def keys(self) -> Iterator[Hashable]:
        """The keys, least recently used first."""
        return iter(self._entries)

    def get(self, key: Hashable):
        """The value under ``key`` (now the most recently used), or None."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        self._entries.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value, size: int) -> bool:
        """Keeps ``value`` under ``key`` unless ``size`` alone exceeds the budget (then False),
        evicting the least recently used until the rest fits."""
        if size > self.budget:
            return False
        if key in self._entries:  # replaced: counted once
            self.bytes -= self._entries.pop(key)[1]
        self._entries[key] = (value, size)
        self.bytes += size
        while self.bytes > self.budget:
            _, (_, old) = self._entries.popitem(last=False)
            self.bytes -= old
            self.evictions += 1
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
