"""The vision tower on the GPU, for one image at a time: ``VisionTower.load(folder)`` then
``tower.features(image)`` -> the merged features [tokens, hidden] that replace the prompt's
image-pad tokens (docs/images.md). ``metalqwen.load`` brings one up for folders that have a
tower and hands its device buffers to the prefill (images.py); preprocessing in
vision_preprocess.py, kernels in shaders/vision.metal, encoding in csrc/engine/vision.cpp.

``tower.prompt_features(image)`` keeps the latest images' features on the device (up to
``cache_bytes``, least recently used dropped first), keyed by the hash of the preprocessed
patches and their grid: a conversation's later turns and a picture given twice reuse them
instead of running the tower again (``runs`` counts the tower's runs, ``reused`` the images
served from the cache).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from . import _core, gpu
from .byte_lru import ByteLRU
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .vision_preprocess import ProcessorConfig, preprocess

__all__ = ["FEATURE_CACHE_BYTES", "VisionTower"]

# Device memory the latest images' features may keep by default (f32 [tokens][hidden] each: a
# 1024-token image of a 4096-wide model takes 16 MiB).
FEATURE_CACHE_BYTES = 64 << 20


class VisionTower:
    def __init__(self, checkpoint: Checkpoint, device: gpu.Device | str | None = None):
        if checkpoint.vision_config is None:
            raise CheckpointError(f"[vision] {checkpoint.path} has no vision tower (no vision_tower.* tensors: a "
                                  f"text-only conversion); images need a folder converted with mlx_vlm.convert")
        self.checkpoint = checkpoint
        self.config = checkpoint.vision_config
        self.processor = ProcessorConfig.from_folder(checkpoint.path)
        if (self.processor.patch_size, self.processor.temporal_patch_size, self.processor.merge_size) != (
                self.config.patch_size, self.config.temporal_patch_size, self.config.spatial_merge_size):
            raise CheckpointError(f"[vision] {checkpoint.path}: the processor's patch/temporal/merge sizes "
                                  f"{self.processor.patch_size}/{self.processor.temporal_patch_size}/"
                                  f"{self.processor.merge_size} differ from vision_config's")
        self.device = device if isinstance(device, gpu.Device) else gpu.Device(device)
        desc = checkpoint.describe()["vision"]
        self._native = _core.VisionTower(self.device._native, desc["dims"], desc["tensors"])
        self._cache = ByteLRU(FEATURE_CACHE_BYTES)  # hash -> features Buffer
        self.runs = 0
        self.reused = 0

    @property
    def cache_bytes(self) -> int:
        """Device memory the cached features may take (0: every image runs the tower)."""
        return self._cache.budget

    @cache_bytes.setter
    def cache_bytes(self, budget: int) -> None:
        self._cache.budget = int(budget)

    @classmethod
    def load(cls, path: str | os.PathLike, device: gpu.Device | str | None = None) -> "VisionTower":
        return cls(load_checkpoint(path), device)

    def patches(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """The tower's input rows and (t, h, w) patch grid of an image (path, bytes, PIL image, uint8 array)."""
        return preprocess(image, self.processor)

    def features(self, image) -> np.ndarray:
        """float32 [h * w / 4, out_hidden]: the image's merged features, one row per image-pad token."""
        rows, (_, h, w) = self.patches(image)
        return self.features_of_patches(rows, h, w)

    def features_of_patches(self, rows: np.ndarray, grid_h: int, grid_w: int) -> np.ndarray:
        self.runs += 1
        return self._native.features(np.ascontiguousarray(rows, np.float32), grid_h, grid_w)

    def features_buffer(self, rows: np.ndarray, grid_h: int, grid_w: int):
        """The same features left on the device (a ``_core.Buffer`` of f32 [h * w / 4][out_hidden])."""
        self.runs += 1
        return self._native.features_buffer(np.ascontiguousarray(rows, np.float32), grid_h, grid_w)

    def prompt_features(self, image, seen: dict | None = None) -> tuple[object, tuple[int, int, int], str]:
        """(the image's features on the device as features_buffer gives them, its (t, h, w) patch grid,
        the sha256 of its grid and patches), from the cache when the same picture was seen lately.
        ``seen`` (hash -> features) holds a prompt's earlier pictures whatever the cache keeps."""
        rows, grid = self.patches(image)
        rows = np.ascontiguousarray(rows, np.float32)
        digest = hashlib.sha256(("%dx%dx%d:" % grid).encode() + rows.tobytes()).hexdigest()
        seen = {} if seen is None else seen
        hit = self._cache.get(digest)
        if hit is not None:
            seen[digest] = hit
        if digest in seen:
            self.reused += 1
            return seen[digest], grid, digest
        buffer = seen[digest] = self.features_buffer(rows, grid[1], grid[2])
        size = rows.shape[0] // self.config.spatial_merge_size ** 2 * self.config.out_hidden_size * 4
        self._cache.put(digest, buffer, size)
        return buffer, grid, digest

    def clear_cache(self) -> None:
        """Drops the cached features (their device memory is freed once no prompt holds them)."""
        self._cache.clear()
