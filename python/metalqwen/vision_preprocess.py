"""An image as the vision tower takes it, computed as Qwen's processor does (mlx-vlm 0.7.10's
Qwen3VLImageProcessor): decode to RGB (Pillow: PNG, JPEG, WebP, GIF's first frame), resize with
PIL bicubic to ``smart_resize``'s size (multiples of patch x merge, within min/max pixels),
x rescale_factor, (x - mean) / std per channel in float32, then patchify.

``preprocess(image, config)`` returns ``(patches, (t, h, w))``: ``patches`` float32
[h * w, C * T * P * P] (each row channel-major, then the temporal copy, then the patch's rows
and columns; a still image is duplicated over the temporal patch), rows in the merger's order
(row-major over 2 x 2 blocks of patches, each block's 4 patches row-major), ``t`` = 1 and h, w
the patch grid. ``ProcessorConfig.from_folder`` reads the folder's settings with mlx-vlm's
precedence: ``preprocessor_config.json``, then ``processor_config.json``'s ``image_processor``;
min/max pixels from ``size.shortest_edge``/``longest_edge``, overridden by ``min_pixels``/``max_pixels``.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from .config import ConfigError

__all__ = ["ProcessorConfig", "load_image", "preprocess", "smart_resize"]


@dataclass(frozen=True)
class ProcessorConfig:
    """Image preprocessing settings (defaults: mlx-vlm's Qwen3VLImageProcessor)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 1280
    rescale_factor: float = 1 / 255.0
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    do_rescale: bool = True
    do_normalize: bool = True

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> "ProcessorConfig":
        raw: dict = {}
        for name, part in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    d = json.load(f)
            except (OSError, ValueError) as e:
                raise ConfigError(f"[vision] cannot read {path}: {e}") from None
            raw.update((d.get(part) or {}) if part else d)
        fields = {k: raw[k] for k in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor",
                                      "do_rescale", "do_normalize") if k in raw}
        fields.update({k: tuple(float(v) for v in raw[k]) for k in ("image_mean", "image_std") if k in raw})
        size = raw.get("size") or {}
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if raw.get(key) is not None:
                fields[key] = int(raw[key])
            elif size.get(edge) is not None:
                fields[key] = int(size[edge])
        c = cls(**fields)
        if len(c.image_mean) != 3 or len(c.image_std) != 3 or min(c.image_std) <= 0 or c.min_pixels > c.max_pixels:
            raise ConfigError(f"[vision] {folder}: image settings make no sense: {c}")
        return c


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of ``factor`` (Python's round: half to even), scaled down
    (floor) or up (ceil) by one factor so the area lies within [min_pixels, max_pixels] — Hugging
    Face's qwen2_vl ``smart_resize``. Aspect ratios beyond 200 are refused."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"[vision] image aspect ratio {max(height, width) / min(height, width):.0f} is beyond 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def load_image(image):
    """A PIL RGB image from a path, encoded bytes, a PIL image or a uint8 array ([H, W], [H, W, 3|4])."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(bytes(image))).convert("RGB")
    if isinstance(image, (str, os.PathLike)):
        with Image.open(image) as im:
            return im.convert("RGB")
    a = np.asarray(image)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)):
        raise ValueError(f"[vision] an image array must be uint8 [H, W] or [H, W, 3|4], got {a.dtype} {list(a.shape)}")
    return Image.fromarray(a).convert("RGB")


def preprocess(image, config: ProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The tower's input rows and patch grid (t, h, w) of one still image (see the module doc)."""
    from PIL import Image

    pil = load_image(image)
    ps, tps, ms = config.patch_size, config.temporal_patch_size, config.merge_size
    height, width = smart_resize(pil.height, pil.width, ps * ms, config.min_pixels, config.max_pixels)
    if (height, width) != (pil.height, pil.width):
        pil = pil.resize((width, height), resample=Image.BICUBIC)
    img = np.asarray(pil).transpose(2, 0, 1).astype(np.float32)  # [C, H, W]
    if config.do_rescale:
        img = img * np.float32(config.rescale_factor)
    if config.do_normalize:
        img = (img - np.array(config.image_mean, np.float32)[:, None, None]) / \
            np.array(config.image_std, np.float32)[:, None, None]
    gh, gw = height // ps, width // ps
    # [C, bh, mh, P, bw, mw, P] -> [bh, bw, mh, mw, C, P, P], then the temporal copies inside C.
    blocks = img.reshape(3, gh // ms, ms, ps, gw // ms, ms, ps).transpose(1, 4, 2, 5, 0, 3, 6)
    patches = np.repeat(blocks[:, :, :, :, :, None], tps, axis=5)  # [.., C, T, P, P]
    return np.ascontiguousarray(patches.reshape(gh * gw, 3 * tps * ps * ps)), (1, gh, gw)
