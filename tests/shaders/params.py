"""The MQ_* constants of shaders/params/<subsystem>.h, read from the headers the kernels use."""

import re
from pathlib import Path

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
