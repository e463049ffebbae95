"""The four mixed-precision recipes of `mlx_lm.convert --quant-predicate` (mixed_3_6 also runs in
test_model.py): per-module bits as config.json records them, logits at every position as mlx-lm's."""

from __future__ import annotations

import pytest

import metalqwen

from ..support import model_fixtures as mf
from ..support.model_checks import assert_logits_close, logit_tolerance, prompt


@pytest.mark.parametrize("name", ["recipe_2_6", "recipe_3_4", "recipe_4_6"])
def test_recipe_logits_match_mlx_lm(converted, device, name):
    path = converted(name)[1]
    m = metalqwen.load(path, device=device, max_context=64, kv_bits=16, progress=False)
    bits = {q.bits for _, q in m.config.quant_overrides if q is not None}
    assert len(bits) == 2, f"{name} should mix two bit widths, config.json has {bits}"
    ids = prompt(m.config.vocab_size, 40, seed=len(name))
    assert_logits_close(m.score(ids), mf.reference_logits(path, ids), logit_tolerance(m.config, 16))
