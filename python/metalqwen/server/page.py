"""The chat page served at /: one HTML file beside this module (page.html, everything inline)."""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def chat_page() -> str:
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
