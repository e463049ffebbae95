"""A prompt's images (docs/images.md): where they go in the token ids, their rotary positions and
their features on the device, ready for the engine's prefill.

Qwen's chat template renders an image as ``<|vision_start|><|image_pad|><|vision_end|>``; the
processor then repeats ``<|image_pad|>`` once per merged feature (``h · w / 4`` for an ``h × w``
patch grid). Messages may carry OpenAI content parts (``{"type": "text"}``, ``{"type":
"image_url"}``, ``{"type": "image"}``), which are flattened to that text in order; a plain text
prompt with ``images=`` renders as one user message with the images first, then the text (mlx-vlm's
order).
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .mrope import rope_index
from .vision_preprocess import smart_resize

__all__ = ["IMAGE_TEXT", "ImageTokens", "PreparedImages", "flatten_messages", "image_tokens", "prepare"]

# What the chat template renders for one image, before the processor repeats the pad.
IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"


@dataclass(frozen=True)
class ImageTokens:
    """The vision token ids of a config (image_token_id, vision_start_token_id, vision_end_token_id)."""
    pad: int
    start: int
    end: int

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], source: str) -> "ImageTokens":
        ids = {}
        for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id"):
            value = raw.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"[images] {source}: {key} must be a token id, got {value!r}")
            ids[key] = value
        return cls(ids["image_token_id"], ids["vision_start_token_id"], ids["vision_end_token_id"])


@dataclass
class PreparedImages:
    """A prompt with images, as the engine's prefill takes it."""
    ids: list[int]                 # the prompt, each image's pad repeated once per feature row
    rope_positions: np.ndarray     # int32 [len(ids), 3]: (time, height, width) per token
    rope_delta: int                # rotary position - cache row after the prompt
    features: list = field(default_factory=list)  # (first row, rows, _core.Buffer f32 [rows][hidden])
    hashes: list[str] = field(default_factory=list)  # sha256 of each image's patch grid and patches
    places: list[tuple[int, int]] = field(default_factory=list)  # (pad index in the ids as given, rows)

    def expanded_position(self, position: int) -> int:
        """A position of the prompt as given (one pad per image) in ``ids``."""
        return position + sum(rows - 1 for at, rows in self.places if at < position)

    def cache_key(self) -> list:
        """The prompt as the prefix cache keys it: the ids, each image's rows holding its hash instead
        of the pad id, so a snapshot after a picture is found again only with the same picture."""
        key: list = list(self.ids)
        for (first, rows, _), digest in zip(self.features, self.hashes):
            key[first:first + rows] = ["image:" + digest] * rows
        return key

    def engine_args(self) -> dict:
        """The engine's prefill arguments (the whole prompt's: a call feeds some of its rows)."""
        return dict(rope_positions=self.rope_positions, features=self.features)


def _part_image(part: Mapping[str, Any], given: list, used: list[int]):
    """The image a content part names: its own value, or the next of ``images=``."""
    kind = part.get("type")
    if kind == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        if not isinstance(url, str):
            raise ValueError(f"[images] an image_url part needs image_url.url (a string), got {part!r}")
        return image_from_url(url)
    value = part.get("image")
    if value is not None:
        return value
    if used[0] >= len(given):
        raise ValueError(f"[images] the messages have more image parts without an image than images= gives "
                         f"({len(given)})")
    used[0] += 1
    return given[used[0] - 1]


def image_from_url(url: str):
    """A data: URL's bytes, or a local path (``file://`` or plain); http(s) is refused here."""
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64"):
            raise ValueError("[images] a data: URL must be base64-encoded (data:image/...;base64,...)")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("[images] a data: URL's payload is not valid base64") from None
    if url.startswith(("http://", "https://")):
        raise ValueError(f"[images] {url[:60]}: fetching URLs is not supported; give a path, bytes or a data: URL")
    path = url[len("file://"):] if url.startswith("file://") else url
    if not os.path.isfile(path):
        raise ValueError(f"[images] {path} is not a file")
    return path


def flatten_messages(messages: Sequence[Mapping[str, Any]], images: Sequence = ()) -> tuple[list[dict], list]:
    """(messages with string contents, the images in prompt order): content parts become text
    with IMAGE_TEXT where each image was; ``{"type": "image"}`` parts without a value take the
    next of ``images``, and images left over go first in the last user message."""
    given, used, found, out = list(images), [0], [], []
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TypeError(f"[images] a message must be a mapping with a role, got {m!r}")
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            text = []
            for part in content:
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind == "text":
                    text.append(str(part.get("text", "")))
                elif kind in ("image_url", "image", "input_image"):
                    found.append(_part_image(part, given, used))
                    text.append(IMAGE_TEXT)
                else:
                    raise ValueError(f"[images] content part {part!r}: expected type text, image_url or image")
            m = {**m, "content": "".join(text)}
        out.append(dict(m))
    rest = given[used[0]:]
    if rest:
        last = max((i for i, m in enumerate(out) if m["role"] == "user"), default=None)
        if last is None:
            raise ValueError("[images] images= needs a user message to go in")
        out[last]["content"] = IMAGE_TEXT * len(rest) + (out[last].get("content") or "")
        # Their ids come before the message's own parts': they were rendered first.
        before = sum(str(m.get("content", "")).count(IMAGE_TEXT) for m in out[:last])
        found[before:before] = rest
    return out, found


def expand(ids: Sequence[int], counts: Sequence[int], tokens: ImageTokens) -> list[int]:
    """``ids`` with the pad after each vision_start repeated ``counts[i]`` times for image i."""
    places = [i for i, t in enumerate(ids) if t == tokens.pad]
    if any(i == 0 or ids[i - 1] != tokens.start for i in places):
        raise ValueError("[images] an <|image_pad|> token that does not follow <|vision_start|>")
    if len(places) != len(counts):
        raise ValueError(f"[images] {len(counts)} images given but the prompt has places for {len(places)} "
                         f"(<|vision_start|><|image_pad|><|vision_end|> each)")
    out, image = [], 0
    for t in ids:
        if t == tokens.pad:
            out.extend([int(t)] * counts[image])
            image += 1
        else:
            out.append(int(t))
    return out


def image_tokens(height: int, width: int, processor) -> int:
    """How many prompt tokens (pads) a still image of ``height × width`` pixels takes: its merged
    features after the processor's resize (``vision_preprocess.ProcessorConfig``), without running
    the tower."""
    p = processor
    h, w = smart_resize(height, width, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels)
    return (h // p.patch_size) * (w // p.patch_size) // (p.merge_size * p.merge_size)


def prepare(ids: Sequence[int], images: Sequence, tower, tokens: ImageTokens) -> PreparedImages:
    """Runs the tower over each image whose features it has not cached (vision.VisionTower.
    prompt_features; they stay on the device) and lays the prompt out."""
    grids, features, hashes, seen = [], [], [], {}
    for image in images:
        buffer, grid, digest = tower.prompt_features(image, seen)
        hashes.append(digest)
        grids.append(grid)
        features.append(buffer)
    merge = tower.config.spatial_merge_size
    counts = [t * h * w // (merge * merge) for t, h, w in grids]
    full = expand(ids, counts, tokens)
    positions, delta = rope_index(full, grids, image_token_id=tokens.pad, vision_start_token_id=tokens.start,
                                  merge_size=merge)
    placed, at = [], 0
    for n, buffer in zip(counts, features):
        first = next(i for i in range(at, len(full)) if full[i] == tokens.pad)
        placed.append((first, n, buffer))
        at = first + n
    places = list(zip((i for i, t in enumerate(ids) if t == tokens.pad), counts))
    return PreparedImages(full, np.ascontiguousarray(positions.T, np.int32), int(delta), placed, hashes, places)
