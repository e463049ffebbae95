"""Checks the model-level tests share: seeded prompts and logits compared against a reference."""

from __future__ import annotations

import numpy as np


def prompt(vocab: int, n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def assert_logits_close(got: np.ndarray, want: np.ndarray, tolerance: float) -> None:
    assert got.shape == want.shape and np.isfinite(got).all()
    scale = np.abs(want).max()
    err = np.abs(got - want).max(axis=1) / scale
    assert err.max() <= tolerance, f"logits differ by {err.max():.3g} (relative), tolerance {tolerance}"
    # Argmax must agree wherever the reference's top-2 margin exceeds twice the row's
    # error (there no rounding can flip it).
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * np.abs(got - want).max(axis=1)
    assert clear.any()
    assert (got.argmax(1) == want.argmax(1))[clear].all()


def logit_tolerance(config, kv_bits: int) -> float:
    """Relative to the largest |logit| of the prompt. With the f16 cache only K/V rounding
    to 11 bits (2^-11) and f32 summation order differ from the reference: 1e-3 (measured
    ~1e-4). The q8 cache rounds each 32-element block to amax/127 steps, an error of up to
    1/254 of the block's largest element, entering the residual stream once per attention
    layer: 1.5 x (attention layers) / 254 (measured about 60 % of it)."""
    if kv_bits == 16:
        return 1e-3
    return 1.5 * sum(t == "full_attention" for t in config.layer_types) / 254


def up_to_eos(tokens: list[int], eos_ids) -> list[int]:
    """A reference's greedy tokens as generation returns them: up to and including the first eos
    (the references go on past it)."""
    eos = set(eos_ids)
    return next((tokens[: i + 1] for i, t in enumerate(tokens) if t in eos), list(tokens))
