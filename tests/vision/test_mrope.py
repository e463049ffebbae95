"""M-RoPE positions (metalqwen.mrope.rope_index) equal mlx-vlm 0.7.10's get_rope_index for prompts
with an image first, text between images, an image after a long text, and none."""

from types import SimpleNamespace

import numpy as np
import pytest

from metalqwen.mrope import rope_index

from .conftest import TOKEN_IDS

START, END, PAD = TOKEN_IDS["vision_start_token_id"], TOKEN_IDS["vision_end_token_id"], TOKEN_IDS["image_token_id"]


def image(h, w):
    """An image's tokens for a (1, h, w) patch grid: start, h * w / 4 pads, end."""
    return [START] + [PAD] * (h * w // 4) + [END]


def text(n, seed=0):
    return [int(i) for i in np.random.default_rng(seed).integers(0, 900, n)]


def mlx_vlm_rope_index(ids, grids):
    import mlx.core as mx
    from mlx_vlm.models.qwen3_5.language import LanguageModel

    config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2), **TOKEN_IDS)
    positions, delta = LanguageModel.get_rope_index(SimpleNamespace(config=config), mx.array([ids]),
                                                    mx.array(grids) if grids else None)
    if not grids:  # text only: mlx-vlm returns [batch, T] positions and no delta
        return np.broadcast_to(np.array(positions)[0], (3, len(ids))), 0
    return np.array(positions)[:, 0, :], int(np.array(delta).reshape(-1)[0])


@pytest.mark.parametrize("ids,grids", [
    (image(4, 4) + text(5), [(1, 4, 4)]),                                    # image first
    (text(3) + image(6, 4) + text(4, 1) + image(4, 8) + text(2, 2), [(1, 6, 4), (1, 4, 8)]),  # text between
    (text(40) + image(8, 6) + text(3, 3), [(1, 8, 6)]),                      # after a long text
    (text(7), []),                                                          # none
])
def test_positions_equal_mlx_vlm(ids, grids):
    got, delta = rope_index(ids, grids, image_token_id=PAD, vision_start_token_id=START)
    want, want_delta = mlx_vlm_rope_index(ids, grids)
    assert got.shape == (3, len(ids)) and np.array_equal(got, want)
    assert delta == want_delta


def test_an_image_after_text_and_the_delta():
    ids = text(2) + image(4, 6) + text(1)  # 2 text, start, 6 image tokens on a 2 x 3 grid, end, 1 text
    pos, delta = rope_index(ids, [(1, 4, 6)], image_token_id=PAD, vision_start_token_id=START)
    assert pos[:, :3].tolist() == [[0, 1, 2]] * 3
    assert pos[:, 3:9].tolist() == [[3] * 6, [3, 3, 3, 4, 4, 4], [3, 4, 5, 3, 4, 5]]
    assert pos[:, 9:].tolist() == [[6, 7]] * 3  # the end token and the text continue from 5 + 1
    assert delta == 8 - len(ids) == -3
