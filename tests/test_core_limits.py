"""The shader limits the Python layer checks against (batching.MAX_ROWS, speculative.MAX_DEPTH,
sampling.MAX_TOP_LOGPROBS, config.MAX_EXPERTS, ...) come from _core, which takes them from
shaders/params/*.h: each export is compared with its #define."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metalqwen import _core

PARAMS = next(p / "shaders" / "params" for p in Path(__file__).resolve().parents if (p / "shaders" / "params").is_dir())


def _define(header: str, name: str) -> int:
    found = re.search(rf"^#define {name} (\d+)\b", (PARAMS / header).read_text(), re.M)
    assert found, f"{name} not in {header}"
    return int(found[1])


@pytest.mark.parametrize("limit, header, define, offset", [
    ("MAX_STEP_ROWS", "quant.h", "MQ_QMV_MAX_ROWS", 0),
    ("MAX_DRAFT", "quant.h", "MQ_QMV_MAX_ROWS", -1),  # one row of a verify step is the chosen token
    ("SMALL_STEP_ROWS", "quant.h", "MQ_QMV_SMALL_ROWS", 0),
    ("MAX_SEQUENCES", "common.h", "MQ_MAX_SEGMENTS", 0),
    ("MAX_TOP_LOGPROBS", "sampling.h", "MQ_LOGPROB_MAX_TOP", 0),
    ("MAX_EXPERTS", "moe.h", "MQ_MOE_MAX_EXPERTS", 0),
    ("MAX_EXPERTS_PER_TOKEN", "moe.h", "MQ_MOE_MAX_TOP_K", 0),
])
def test_core_exports_the_shader_limits(limit, header, define, offset):
    assert getattr(_core, limit) == _define(header, define) + offset

