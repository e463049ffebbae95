"""safetensors shards: their headers (never their data), the tensors they hold, and the
weight files of a checkpoint folder.

Absolute offsets are NOT aligned in general: mlx writes the header without padding, so
data may start at any even byte. Consumers copy (or realign) rather than alias the map.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from .config import CheckpointError

__all__ = ["DTYPE_SIZE", "ShardInfo", "TensorInfo", "index_map", "read_safetensors_header", "shard_files",
           "tensor_view"]

# safetensors dtype tag -> element size in bytes
DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
# numpy view of each tag (bf16 as its uint16 bit patterns; little-endian as the format says)
_NUMPY_DTYPE = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "F8_E4M3": "|u1", "F8_E5M2": "|u1",
    "U16": "<u2", "I16": "<i2", "F16": "<f2", "BF16": "<u2",
    "U32": "<u4", "I32": "<i4", "F32": "<f4",
    "U64": "<u8", "I64": "<i8", "F64": "<f8",
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference reader's limit


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: ``offset`` is absolute in ``file`` (header included)."""

    name: str
    file: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    bits: int | None = None
    group_size: int | None = None
    mode: str | None = None  # affine, mxfp4, nvfp4, mxfp8 (quantized modules only)
    add: float = 0.0  # added to every element at load: 1 for MTP norms stored unshifted (mtp_checkpoint.py)

    def entry(self) -> tuple:
        """(file, offset, nbytes, dtype, shape, bits, group_size, mode[, add]): the engine's view (add
        only when it is not 0)."""
        entry = (self.file, self.offset, self.nbytes, self.dtype, self.shape, self.bits, self.group_size, self.mode)
        return entry + (self.add,) if self.add else entry


@dataclass(frozen=True)
class ShardInfo:
    """One safetensors file: its size and where its data region starts (8 + header length)."""

    path: str
    size: int
    data_start: int
    metadata: dict


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], ShardInfo]:
    """Parses one safetensors file's header (never its data) and checks it against the file size.

    Raises CheckpointError naming the file (and the tensor) for: a missing or unreadable
    file, a header length running past the end, bad JSON, malformed entries, unknown
    dtypes, byte counts that disagree with dtype x shape, data past the end of the file
    (truncation) and tensors whose bytes overlap.
    """
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"[checkpoint] {path}: truncated: {size} bytes, too short for the "
                                      f"8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"[checkpoint] {path}: corrupt or truncated header: header length {n} "
                                      f"runs past the end of the {size}-byte file")
            raw = f.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"[checkpoint] {path}: file is missing") from None
    except OSError as e:
        raise CheckpointError(f"[checkpoint] {path}: cannot read: {e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"[checkpoint] {path}: corrupt header: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"[checkpoint] {path}: corrupt header: expected a JSON object, "
                              f"got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"[checkpoint] {path}: corrupt header: __metadata__ must be an object")

    data_start = 8 + n
    data_size = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, e in header.items():
        where = f"[checkpoint] {path}: tensor {name}"
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= e.keys():
            raise CheckpointError(f"{where}: corrupt header entry {e!r} (needs dtype, shape, data_offsets)")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZE:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise CheckpointError(f"{where}: corrupt shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise CheckpointError(f"{where}: corrupt data_offsets {offsets!r}")
        begin, end = offsets
        if begin > end:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] are out of order")
        need = math.prod(shape) * DTYPE_SIZE[dtype]
        if end - begin != need:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes but "
                                  f"{dtype} {shape} needs {need}")
        if end > data_size:
            raise CheckpointError(f"{where}: data ends at byte {data_start + end}, past the end of the "
                                  f"{size}-byte file (truncated download?)")
        tensors[name] = TensorInfo(name, path, data_start + begin, need, dtype, tuple(shape))

    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(f"[checkpoint] {path}: tensors {n0} and {n1} overlap "
                                  f"(bytes {b0}..{e0} and {b1}..{e1})")
    return tensors, ShardInfo(path, size, data_start, {str(k): v for k, v in metadata.items()})


def tensor_view(t: TensorInfo, mapped: np.ndarray | None = None) -> np.ndarray:
    """A read-only view of one tensor's bytes (bf16 as uint16), from ``mapped`` (the whole file,
    memory-mapped) or a new map of just this tensor."""
    dtype = np.dtype(_NUMPY_DTYPE[t.dtype])
    if t.nbytes == 0:
        a = np.zeros(t.shape, dtype)
    elif mapped is not None:
        a = mapped[t.offset: t.offset + t.nbytes].view(dtype).reshape(t.shape)
    else:
        a = np.memmap(t.file, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,)).view(dtype).reshape(t.shape)
    a.flags.writeable = False
    return a


def shard_files(folder: str) -> list[str]:
    """The weight files of a folder: from model.safetensors.index.json, else model.safetensors,
    else every *.safetensors."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, "rb") as f:
                weight_map = json.loads(f.read().decode("utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError("weight_map must map tensor names to file names")
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"[checkpoint] {index}: corrupt index ({e!s})") from None
        files = []
        for name in dict.fromkeys(weight_map.values()):
            p = os.path.join(folder, name)
            if os.path.dirname(os.path.normpath(name)) or not os.path.isfile(p):
                raise CheckpointError(f"[checkpoint] {index}: shard {name} (holding e.g. "
                                      f"{next(k for k, v in weight_map.items() if v == name)}) is missing")
            files.append(p)
        return files
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"[checkpoint] {folder}: no *.safetensors weight files")
    return files


def index_map(folder: str) -> dict[str, str] | None:
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.isfile(index):
        return None
    with open(index, "rb") as f:
        return json.loads(f.read().decode("utf-8"))["weight_map"]
