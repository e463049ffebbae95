"""Image prompts on a Qwen3.5-MoE VLM (qwen3_5_moe: 8 experts top-2, as mlx_vlm.convert writes it:
4-bit experts, 8-bit router and shared_expert_gate, tower float) against mlx-vlm 0.7.10's model of
the folder in float32: logits at every position of a prompt with two pictures, and greedy tokens
after one picture (decode rotating at cache row + rope_delta through the expert layers)."""

import numpy as np

import metalqwen

from ..support.model_checks import assert_logits_close, logit_tolerance, up_to_eos
from .test_prompts import ONE, TWO, case, patches_of, reference_greedy, reference_logits, reference_of


def test_moe_vlm_equals_mlx_vlm(vlm, device):
    folder = vlm(quantize=True, moe=True)
    model = metalqwen.load(folder, device=device, max_context=128, kv_bits=16, progress=False, prefill_chunk=16)
    assert model.config.is_moe and model.vision is not None
    reference = reference_of(folder)
    prompt, images = case(TWO)
    ids = model.prompt_ids(prompt, chat=True, images=images)
    rows, grids = patches_of(model, images)
    want = np.array(reference_logits(reference, ids, rows, grids))
    assert_logits_close(model.score(prompt, images=images, chat=True), want, logit_tolerance(model.config, 16))
    prompt, images = case(ONE)
    ids = model.prompt_ids(prompt, chat=True, images=images)
    rows, grids = patches_of(model, images)
    want, _ = reference_greedy(reference, ids, rows, grids, 6)
    got = model.generate(prompt, max_tokens=6, chat=True, images=images, speculative="off")
    assert got.tokens == up_to_eos(want, model.eos_token_ids)
