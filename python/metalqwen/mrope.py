"""Multimodal rotary positions (M-RoPE) of a prompt with images, as Qwen3.5 computes them
(mlx-vlm 0.7.10's ``get_rope_index``, images only).

Each token gets three position components (time, height, width). Text tokens have all three
equal: the text before the first image counts 0, 1, 2, ...; an image's ``h' x w'`` merged tokens
(the grid's h and w over the merge size) get ``(t, row, col)`` plus the position the image starts
at; text after an image continues from the largest component used so far plus one. Decoding
then uses ``cache index + delta`` for all three components, ``delta = largest position + 1 -
tokens`` (negative after images). Text-only prompts: positions 0..T-1 and delta 0, so text
decoding is unchanged. The engine's prefill takes them per row (images.py, docs/images.md).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["rope_index"]


def rope_index(ids: Sequence[int], grids: Sequence[tuple[int, int, int]], *, image_token_id: int,
               vision_start_token_id: int, merge_size: int = 2) -> tuple[np.ndarray, int]:
    """(positions int64 [3, len(ids)], delta) for one prompt; ``grids`` the (t, h, w) patch grid of
    each image, in prompt order. An image is a ``vision_start`` token followed by its
    ``t * h * w / merge_size²`` image tokens."""
    ids = [int(i) for i in ids]
    n = len(ids)
    if not grids:
        return np.broadcast_to(np.arange(n, dtype=np.int64), (3, n)).copy(), 0
    images = sum(1 for a, b in zip(ids, ids[1:]) if a == vision_start_token_id and b == image_token_id)
    if images > len(grids):
        raise ValueError(f"[mrope] the prompt has {images} images but {len(grids)} patch grids were given")
    parts: list[np.ndarray] = []
    start = 0  # the next token to place

    def next_position() -> int:
        return int(parts[-1].max()) + 1 if parts else 0

    for t, h, w in grids[:images]:
        end = ids.index(image_token_id, start)
        gt, gh, gw = int(t), int(h) // merge_size, int(w) // merge_size
        first = next_position()
        text = end - start
        parts.append(np.broadcast_to(np.arange(text, dtype=np.int64) + first, (3, text)))
        grid = np.stack(np.meshgrid(np.arange(gt), np.arange(gh), np.arange(gw), indexing="ij")).reshape(3, -1)
        parts.append(grid.astype(np.int64) + text + first)
        start = end + gt * gh * gw
    if start < n:
        first = next_position()
        parts.append(np.broadcast_to(np.arange(n - start, dtype=np.int64) + first, (3, n - start)))
    if not parts:
        return np.broadcast_to(np.arange(n, dtype=np.int64), (3, n)).copy(), 0
    positions = np.concatenate(parts, axis=1)
    return positions, int(positions.max()) + 1 - n
