"""The prefix cache's snapshots on disk (``load(cache_dir=...)``, ``--cache-dir``), so that a long
system prompt resumes after a restart.

A file holds one snapshot: MAGIC, a little-endian u32 header length, the JSON header (the
model identity, position, rotary offset, token ids and cache key), the state bytes as
``Snapshot.data`` holds them, then the sha256 of everything before it. Its name is
``<position>-<sha256 of identity and key>.mqsnap``, so a lookup hashes the prompt's prefixes only
at the positions the folder has files for. A file is written on a background thread (a temp file
renamed into place: readers and other writers never see half of one), read back on the request
path when it covers more of a prompt than memory does, and checked whole before the engine gets
it: a corrupt, truncated or foreign file is removed with one warning naming it. The folder stays
within a byte budget, the least recently used (file mtime, touched on each hit) removed first.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import struct
import threading
import time
import warnings
import weakref
from collections import deque
from typing import Sequence

from . import _core
from .errors import EngineError

__all__ = ["DiskCache", "DEFAULT_BUDGET", "model_identity"]

MAGIC = b"MQSNAP01"
SUFFIX = ".mqsnap"
DEFAULT_BUDGET = 10 << 30  # bytes of files in the folder (--cache-dir-gb's default 10)
MAX_PENDING = 8  # writes queued at most; more are skipped (counted) rather than hold device memory
_STALE_TEMP = 3600.0  # seconds after which a temp file is a crashed writer's leftover
_SAMPLE = 4096  # bytes of each tensor read at its start, middle and end for the weights' identity


_LIVE: "weakref.WeakSet[DiskCache]" = weakref.WeakSet()  # caches whose queued writes finish at exit


@atexit.register
def _flush_at_exit() -> None:
    for cache in list(_LIVE):
        cache.flush(30.0)


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()


def _weights_sample(tensors: dict) -> str:
    """sha256 of each tensor's first, middle and last 4 KiB (entries as Checkpoint.describe gives
    them): tells a fine-tune from its base without reading every weight."""
    h = hashlib.sha256()
    handles: dict[str, int] = {}
    try:
        for name, (file, offset, nbytes, *_) in sorted(tensors.items()):
            fd = handles.get(file)
            if fd is None:
                fd = handles[file] = os.open(file, os.O_RDONLY)
            h.update(name.encode() + b"\0")
            for at in sorted({0, max(nbytes // 2 - _SAMPLE // 2, 0), max(nbytes - _SAMPLE, 0)}):
                h.update(os.pread(fd, min(_SAMPLE, nbytes - at), offset + at))
    finally:
        for fd in handles.values():
            os.close(fd)
    return h.hexdigest()


def model_identity(checkpoint, engine, kv_bits: int, mtp_hidden: str, device_kind: str, device_name: str,
                   drafter=None) -> str:
    """What a snapshot's bytes depend on, as a hex digest: this metalqwen (its Python sources and
    shader files), the device, the model's config, tensor layout and sampled weights, the drafter's
    likewise, and the engine options that shape the state (KV bits, max_context, layer range,
    MTP head and its input, the snapshot's region layout)."""
    from .pipeline import model_identity as layout_identity, package_identity  # its digests, reused

    desc = checkpoint.describe()
    tensors = {**desc["tensors"], **desc["mtp"]} if engine.has_mtp else desc["tensors"]
    draft = None
    if drafter is not None:
        d = drafter.describe()
        draft = [d["dims"], {n: e[1:] for n, e in d["tensors"].items()}, _weights_sample(d["tensors"])]
    return _digest("metalqwen disk cache 1", package_identity().hex(), _core.shader_library_key(), device_kind,
                   device_name, layout_identity(checkpoint).hex(), _weights_sample(tensors), kv_bits,
                   engine.max_context, engine.layers, engine.has_mtp, mtp_hidden, draft, engine.snapshot_layout)


def _key_bytes(key: Sequence) -> list[bytes]:
    """Each key element as hashed: token ids and image hashes ("image:<sha256>") apart."""
    return [repr(k).encode() + b";" for k in key]


class DiskCache:
    """Snapshots of ``engine`` kept as files in ``folder`` (made if missing) up to ``budget_bytes``.
    ``identity``: model_identity's digest; files of any other identity are never loaded.
    Counters: ``hits`` (snapshots served from disk), ``writes`` and ``bytes_written``, ``skipped``
    (writes dropped while MAX_PENDING were queued), ``rejected`` (files removed as corrupt or
    foreign), ``evictions``, ``write_errors``; ``bytes``: the folder's files, as last counted."""

    def __init__(self, folder: str | os.PathLike, budget_bytes: int, engine, identity: str):
        self.folder = os.fspath(folder)
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as e:
            raise ValueError(f"[prefix cache] cache_dir {self.folder}: cannot make the folder ({e.strerror})") from None
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise ValueError(f"[prefix cache] cache_dir {self.folder}: not a folder this process may write")
        self.budget = int(budget_bytes)
        self.identity = identity
        self._engine = engine
        self.hits = self.writes = self.bytes_written = self.skipped = 0
        self.rejected = self.evictions = self.write_errors = 0
        self.bytes = 0
        self._queue: deque = deque()  # (snapshot, key) to write, oldest first
        self._busy = 0  # writes queued or under way
        self._cond = threading.Condition()
        self._writing = False  # a writer thread runs (it ends when the queue is empty)
        self._evict()
        _LIVE.add(self)  # a closing server or chat still writes what it queued

    # ---- reading (the request's thread)

    def longest(self, key: Sequence, longer_than: int = 0):
        """A _core.Snapshot of the longest proper prefix of ``key`` (token ids or a cache_key) longer
        than ``longer_than`` tokens that a file here holds, imported into the engine; or None."""
        positions = sorted({p for p, _ in self._files() if longer_than < p < len(key)})
        if not positions:
            return None
        parts = _key_bytes(key[: positions[-1]])
        h, done, names = hashlib.sha256(self.identity.encode()), 0, {}
        for p in positions:
            h.update(b"".join(parts[done:p]))
            done = p
            names[p] = f"{p}-{h.hexdigest()}{SUFFIX}"
        for p in reversed(positions):
            snapshot = self._load(os.path.join(self.folder, names[p]), key[:p])
            if snapshot is not None:
                self.hits += 1
                return snapshot
        return None

    def _files(self) -> list[tuple[int, str]]:
        """(position, name) of the folder's snapshot files (none if the folder went away)."""
        found = []
        try:
            with os.scandir(self.folder) as entries:
                for e in entries:
                    head, _, rest = e.name.partition("-")
                    if e.name.endswith(SUFFIX) and head.isdigit() and len(rest) == 64 + len(SUFFIX):
                        found.append((int(head), e.name))
        except OSError:
            return []
        return found

    def _load(self, path: str, key: Sequence):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # not written, or just evicted by another process
            return None
        except OSError as e:
            return self._reject(path, f"unreadable ({e.strerror})")
        view = memoryview(data)
        if len(data) < len(MAGIC) + 4 + 32 or data[: len(MAGIC)] != MAGIC:
            return self._reject(path, "not a metalqwen snapshot file (truncated, or another format)")
        if hashlib.sha256(view[:-32]).digest() != data[-32:]:
            return self._reject(path, "its checksum does not match (corrupt or truncated)")
        (size,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4 + size
        try:
            header = json.loads(bytes(view[len(MAGIC) + 4: start]))
        except ValueError:
            return self._reject(path, "its header is not JSON")
        if header.get("identity") != self.identity:
            return self._reject(path, "written for another model, metalqwen version, device or engine setup")
        if header.get("key") != list(key) or header.get("payload") != len(data) - 32 - start:
            return self._reject(path, "its header does not match its name")
        try:
            snapshot = self._engine.import_snapshot(header["position"], header["rope_delta"], header["tokens"],
                                                    view[start:-32])
        except (EngineError, KeyError, TypeError) as e:
            return self._reject(path, f"the engine refused it ({e})")
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return snapshot

    def _reject(self, path: str, why: str) -> None:
        self.rejected += 1
        warnings.warn(f"[prefix cache] {path}: {why}; ignored and removed", RuntimeWarning, stacklevel=2)
        try:
            os.unlink(path)
        except OSError:
            pass
        return None

    # ---- writing (a background thread)

    def store(self, snapshot, key: Sequence) -> None:
        """Queues ``snapshot`` (taken by this engine, its GPU copy finished) to be written under ``key``
        (not when it alone exceeds the budget)."""
        if snapshot.nbytes > self.budget:
            return
        with self._cond:
            if len(self._queue) >= MAX_PENDING:
                self.skipped += 1
                return
            self._queue.append((snapshot, list(key)))
            self._busy += 1
            if not self._writing:
                self._writing = True
                threading.Thread(target=self._writer, name="metalqwen-disk-cache", daemon=True).start()

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until the queued writes are done (False if ``timeout`` seconds passed first)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._busy == 0, timeout)

    def _writer(self) -> None:
        while True:
            with self._cond:
                if not self._queue:  # no thread left holding the cache (and its engine) while idle
                    self._writing = False
                    return
                snapshot, key = self._queue.popleft()
            try:
                self._write(snapshot, key)
            except Exception as e:  # a full disk, a removed folder: counted, said once, the next write tried
                self.write_errors += 1
                if self.write_errors == 1:
                    warnings.warn(f"[prefix cache] cannot write to {self.folder}: {e}", RuntimeWarning)
            finally:
                del snapshot  # its device memory goes now, not after the next write
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def file_name(self, key: Sequence) -> str:
        """The name of the file a snapshot under ``key`` is kept in (longest hashes the same way)."""
        return f"{len(key)}-{hashlib.sha256(self.identity.encode() + b''.join(_key_bytes(key))).hexdigest()}{SUFFIX}"

    def _write(self, snapshot, key: list) -> None:
        name = self.file_name(key)
        path = os.path.join(self.folder, name)
        try:
            os.utime(path)  # written already (by this or another process): now the latest used
            return
        except FileNotFoundError:
            pass
        payload = memoryview(snapshot.data)[: snapshot.nbytes]
        header = json.dumps({"identity": self.identity, "position": snapshot.position,
                             "rope_delta": snapshot.rope_delta, "tokens": list(snapshot.tokens), "key": key,
                             "payload": len(payload)}).encode()
        temp = os.path.join(self.folder, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        check = hashlib.sha256()
        try:
            with open(temp, "wb") as f:
                for part in (MAGIC, struct.pack("<I", len(header)), header, payload):
                    check.update(part)
                    f.write(part)
                f.write(check.digest())
            os.replace(temp, path)  # whole or not at all, for every reader
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        self.writes += 1
        self.bytes_written += os.path.getsize(path)
        self._evict()

    def _evict(self) -> None:
        """Removes the least recently used files beyond the budget, and crashed writers' temp files."""
        files, now = [], time.time()
        with os.scandir(self.folder) as entries:
            for e in entries:
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                if e.name.endswith(SUFFIX) and not e.name.startswith("."):
                    files.append((st.st_mtime, st.st_size, e.path))
                elif e.name.endswith(".tmp") and e.name.startswith(".") and now - st.st_mtime > _STALE_TEMP:
                    self._remove(e.path)
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget:
                break
            if self._remove(path):
                self.evictions += 1
            total -= size
        self.bytes = total

    @staticmethod
    def _remove(path: str) -> bool:
        try:
            os.unlink(path)
            return True
        except OSError:  # another process removed it first
            return False
