"""The vision tower on the GPU, for one image at a time: ``VisionTower.load(folder)`` then
``tower.features(image)`` -> the merged features [tokens, hidden] that replace the prompt's
image-pad tokens (docs/images.md). ``metalqwen.load`` brings one up for folders that have a
tower and hands its device buffers to the prefill (images.py); preprocessing in
vision_preprocess.py, kernels in shaders/vision.metal, encoding in csrc/engine/vision.cpp.
"""

from __future__ import annotations

import os

import numpy as np

from . import _core, gpu
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .vision_preprocess import ProcessorConfig, preprocess

__all__ = ["VisionTower"]


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
        return self._native.features(np.ascontiguousarray(rows, np.float32), grid_h, grid_w)

    def features_buffer(self, rows: np.ndarray, grid_h: int, grid_w: int):
        """The same features left on the device (a ``_core.Buffer`` of f32 [h * w / 4][out_hidden])."""
        return self._native.features_buffer(np.ascontiguousarray(rows, np.float32), grid_h, grid_w)
