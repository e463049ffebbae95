"""The MQ_* constants of shaders/params/<subsystem>.h, read from the headers the kernels use,
and the step-segment table every per-sequence kernel takes (params/common.h)."""

import re
from pathlib import Path

import numpy as np

PARAMS = Path(__file__).resolve().parents[2] / "shaders" / "params"


def header_constants(subsystem: str) -> dict[str, int]:
    """The MQ_* #defines of shaders/params/<subsystem>.h, evaluated in order; a define may use
    those of the headers shaders/params.h includes before it (e.g. moe.h uses quant.h's)."""
    order = re.findall(r'#include "params/(\w+)\.h"', (PARAMS.parent / "params.h").read_text())
    values: dict[str, int] = {}
    for header in order[: order.index(subsystem) + 1]:
        text = (PARAMS / f"{header}.h").read_text()
        for name, expr in re.findall(r"^#define\s+(MQ_\w+)\s+(.+?)\s*$", text, flags=re.M):
            values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))  # noqa: S307 (our own header)
    return values


MAX_SEGMENTS = header_constants("common")["MQ_MAX_SEGMENTS"]
# struct StepSegment { uint slot, first_row, rows, position; }; struct StepSegments { uint count; StepSegment seg[8]; }
STEP_SEGMENT = np.dtype([(name, "<u4") for name in ("slot", "first_row", "rows", "position")])
STEP_SEGMENTS = np.dtype([("count", "<u4"), ("seg", STEP_SEGMENT, (MAX_SEGMENTS,))])


def step_segments(*segments: tuple[int, int, int]) -> np.ndarray:
    """StepSegments (params/common.h) for (slot, rows, position) segments laid out in order:
    each segment's first row follows the previous segment's rows."""
    assert 1 <= len(segments) <= MAX_SEGMENTS
    table = np.zeros(1, STEP_SEGMENTS)
    table["count"] = len(segments)
    first = 0
    for i, (slot, rows, position) in enumerate(segments):
        table["seg"][0, i] = (slot, first, rows, position)
        first += rows
    return table
