"""The MQ_* constants of shaders/params/<subsystem>.h, read from the headers the kernels use."""

import re
from pathlib import Path

PARAMS = Path(__file__).resolve().parents[2] / "shaders" / "params"


def header_constants(subsystem: str) -> dict[str, int]:
    """The MQ_* #defines of shaders/params/<subsystem>.h, evaluated in order."""
    text = (PARAMS / f"{subsystem}.h").read_text()
    values: dict[str, int] = {}
    for name, expr in re.findall(r"^#define\s+(MQ_\w+)\s+(.+?)\s*$", text, flags=re.M):
        values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))  # noqa: S307 (our own header)
    return values
