"""Checks of the arguments users pass to generate/stream/score: each failure is a
TypeError (wrong kind of value) or ValueError (out of range) naming the argument, the
value and what is allowed. The sampling settings' checks are in sampling.py."""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Sequence

import numpy as np


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def number(name: str, value: Any, *, low: float, high: float = float("inf"), low_open: bool = False,
           allowed: str) -> float:
    """A real number in [low, high] ((low, high] when low_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number ({allowed}), got {_describe(value)}")
    value = float(value)
    if not (low < value if low_open else low <= value) or not value <= high:
        raise ValueError(f"{name} must be {allowed}, got {value:g}")
    return value


def integer(name: str, value: Any, *, low: int, allowed: str) -> int:
    """An integer >= low."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer ({allowed}), got {_describe(value)}")
    if value < low:
        raise ValueError(f"{name} must be {allowed}, got {int(value)}")
    return int(value)


def stop_strings(stop: Any) -> list[str]:
    """None, one string or a sequence of non-empty strings."""
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise TypeError(f"stop must be a string or a list of non-empty strings, got {_describe(stop)}")
    return list(items)


def token_ids(name: str, value: Any, vocab_size: int) -> list[int]:
    """A non-empty sequence of ids in [0, vocab_size); text is refused with a hint."""
    if isinstance(value, str):
        raise TypeError(f"{name} must be token ids (a list of int), got text; encode it with model.tokenizer.encode")
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise TypeError(f"{name} must be a 1-D array of integer token ids, got {value.dtype} {value.shape}")
        value = value.tolist()
    if not isinstance(value, Sequence):
        raise TypeError(f"{name} must be token ids (a list of int), got {_describe(value)}")
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{name} must hold integer token ids; item {i} is {_describe(t)}")
    ids = [int(t) for t in value]
    if not ids:
        raise ValueError(f"{name} is empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{name} has token ids outside the vocabulary (0..{vocab_size - 1}): {bad[:5]}")
    return ids


def prompt_kind(prompt: Any) -> str:
    """'text', 'ids' or 'messages' (a list of chat messages, dicts); anything else is a TypeError
    saying what a prompt may be."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        return "text"
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, Mapping) for p in prompt):
        return "messages"
    if isinstance(prompt, (list, tuple, np.ndarray)) and not any(isinstance(p, dict) for p in prompt):
        return "ids"
    hint = " (for a conversation, pass a list of messages)" if isinstance(prompt, (dict, list)) else ""
    raise TypeError(f"prompt must be text (str), token ids (a list of int) or chat messages (a list of dicts), "
                    f"got {_describe(prompt)}{hint}")
