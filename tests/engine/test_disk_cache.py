"""The prefix cache on disk (load(cache_dir=...)): a new model instance resumes from the files
another wrote with exactly a cold run's tokens, log-probabilities and logits; corrupt, truncated
and foreign files are never loaded (one warning each); the folder stays within its budget, least
recently used first; two instances writing one folder leave only whole files."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import threading
import time
import warnings

import numpy as np
import pytest

import metalqwen
from metalqwen.demo_checkpoint import write_demo_checkpoint
from metalqwen.disk_cache import SUFFIX

pytestmark = pytest.mark.spread


def _ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 1000, n)]


SYSTEM = _ids(44, 1)  # a shared start, as a system prompt: snapshotted at its end
FIRST, SECOND = SYSTEM + _ids(9, 2), SYSTEM + _ids(12, 3)


def _load(path, device, folder=None, **options):
    return metalqwen.load(path, device=device, max_context=96, progress=False, cache_dir=folder, **options)


def _answer(model, ids) -> list:
    """Greedy tokens with their log-probabilities and top 5, snapshotting at the end of SYSTEM."""
    chunks = list(model.stream(ids, max_tokens=4, boundaries=[len(SYSTEM)], logprobs=5))
    return [(c.token, c.logprob, c.top_logprobs) for c in chunks]


@contextlib.contextmanager
def _no_cache_warnings():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    assert not [str(w.message) for w in seen if "[prefix cache]" in str(w.message)]


def _cache_warnings(seen) -> list[str]:
    return [str(w.message) for w in seen if "[prefix cache]" in str(w.message)]


@pytest.fixture(scope="module")
def cold(demo, device) -> list:
    return _answer(_load(demo, device), SECOND)


@pytest.fixture
def written(demo, device, tmp_path) -> str:
    """A folder where one instance answered FIRST (files at the end of SYSTEM and of FIRST)."""
    folder = str(tmp_path / "cache")
    m = _load(demo, device, folder)
    _answer(m, FIRST)
    assert m.prefix_cache.disk.flush(60)
    assert sorted(int(n.split("-")[0]) for n in os.listdir(folder)) == [len(SYSTEM), len(FIRST)]
    return folder


def test_a_new_instance_resumes_from_the_files_exactly(demo, device, written, cold):
    again = _load(demo, device, written)
    with _no_cache_warnings():
        assert _answer(again, SECOND) == cold
    assert again.last_stats.prompt_tokens_reused == len(SYSTEM) and again.prefix_cache.disk.hits == 1
    # The logits too, from the disk alone (no device memory for snapshots: every hit reads the file).
    disk_only = _load(demo, device, written, prefix_cache_bytes=0)
    engine = disk_only._engine
    snapshot = disk_only.prefix_cache.longest(SECOND)
    assert snapshot.position == len(SYSTEM) and disk_only.prefix_cache.disk.hits == 1
    engine.restore(0, snapshot)
    resumed = engine.prefill(0, SECOND[len(SYSTEM):], logits="all")
    engine.reset(0)
    assert np.array_equal(resumed, engine.prefill(0, SECOND, logits="all")[len(SYSTEM):])


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_file_is_ignored_with_one_warning(demo, device, written, cold, damage):
    m = _load(demo, device, written)
    path = os.path.join(written, m.prefix_cache.disk.file_name(SYSTEM))
    data = bytearray(pathlib.Path(path).read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x10
    else:
        del data[len(data) - 100:]
    pathlib.Path(path).write_bytes(data)
    with pytest.warns(RuntimeWarning) as seen:
        assert _answer(m, SECOND) == cold
    assert _cache_warnings(seen) == [f"[prefix cache] {path}: its checksum does not match (corrupt or "
                                              f"truncated); ignored and removed"]
    assert m.last_stats.prompt_tokens_reused == 0 and m.prefix_cache.disk.hits == 0
    assert m.prefix_cache.disk.rejected == 1 and m.prefix_cache.disk.flush(60)
    with _no_cache_warnings():  # the answer's own snapshot took the file's place, whole
        assert _load(demo, device, written).prefix_cache.longest(SECOND).position == len(SYSTEM)


def test_a_foreign_file_is_never_loaded(demo, device, written, tmp_path):
    other_path = write_demo_checkpoint(str(tmp_path / "other"), seed=1)  # same shapes, other weights
    mine = _load(demo, device, written).prefix_cache.disk.identity
    identities = {mine, _load(other_path, device, written).prefix_cache.disk.identity,
                  _load(demo, device, written, kv_bits=16).prefix_cache.disk.identity,
                  metalqwen.load(demo, device=device, max_context=97, progress=False,
                                 cache_dir=written).prefix_cache.disk.identity}
    assert len(identities) == 4
    other = _load(other_path, device, written)
    cold = _answer(_load(other_path, device), SECOND)
    with _no_cache_warnings():
        assert _answer(other, SECOND) == cold  # the first model's files are not under its names
    assert other.last_stats.prompt_tokens_reused == 0 and other.prefix_cache.disk.hits == 0
    # A file of the first model put where the other's snapshot of SYSTEM would be: refused.
    other = _load(other_path, device, written)
    disk = other.prefix_cache.disk
    planted = os.path.join(written, disk.file_name(SYSTEM))
    shutil.copy(os.path.join(written, _load(demo, device, written).prefix_cache.disk.file_name(SYSTEM)), planted)
    with pytest.warns(RuntimeWarning, match="another model") as seen:
        assert _answer(other, SECOND) == cold
    assert len(_cache_warnings(seen)) == 1 and planted in _cache_warnings(seen)[0]
    assert other.last_stats.prompt_tokens_reused == 0 and disk.hits == 0 and disk.rejected == 1


def test_the_folder_stays_within_its_budget_least_recently_used_first(demo, device, tmp_path):
    folder = str(tmp_path / "cache")
    m = _load(demo, device, folder, prefix_cache_bytes=0)
    disk, engine, ids = m.prefix_cache.disk, m._engine, _ids(40, 4)
    taken = []
    engine.prefill(0, ids, snapshot_at=[10, 20, 25, 30], snapshots=taken)
    snaps = {s.position: s for s in taken}
    now = time.time()
    for age, p in ((30, 10), (20, 20), (10, 30)):
        disk.store(snaps[p], ids[:p])
        assert disk.flush(60)
        os.utime(os.path.join(folder, disk.file_name(ids[:p])), (now - age, now - age))
    size = {p: os.path.getsize(os.path.join(folder, disk.file_name(ids[:p]))) for p in (10, 20, 30)}
    assert m.prefix_cache.longest(ids[:15]).position == 10 and disk.hits == 1  # 10 is now the latest used
    disk.budget = size[10] + 2 * size[30] - 1  # room for 10, 25 and 30 (25's file is smaller than 30's), not 20
    disk.store(snaps[25], ids[:25])
    assert disk.flush(60)
    left = sorted(int(n.split("-")[0]) for n in os.listdir(folder))
    assert left == [10, 25, 30] and disk.evictions == 1 and disk.bytes <= disk.budget


def test_two_instances_writing_one_folder_leave_only_whole_files(demo, device, tmp_path):
    folder = str(tmp_path / "cache")
    ids, positions = _ids(40, 5), [4, 13, 21, 34]
    writers = [_load(demo, device, folder, prefix_cache_bytes=0) for _ in range(2)]
    taken = [[], []]
    for m, snaps in zip(writers, taken):
        m._engine.prefill(0, ids, snapshot_at=positions, snapshots=snaps)

    def write(m, snaps):
        for s in snaps:  # the same keys from both, in opposite orders
            m.prefix_cache.disk.store(s, ids[:s.position])
            time.sleep(0.001)

    threads = [threading.Thread(target=write, args=pair) for pair in zip(writers, [taken[0], taken[1][::-1]])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(m.prefix_cache.disk.flush(60) for m in writers)
    assert [m.prefix_cache.disk.skipped for m in writers] == [0, 0]
    assert sorted(os.listdir(folder)) == sorted(writers[0].prefix_cache.disk.file_name(ids[:p]) for p in positions)
    assert all(n.endswith(SUFFIX) for n in os.listdir(folder))
    reader = _load(demo, device, folder, prefix_cache_bytes=0)
    with _no_cache_warnings():
        for p in positions:
            assert reader.prefix_cache.disk.longest(ids[: p + 1], longer_than=p - 1).position == p
    assert reader.prefix_cache.disk.hits == len(positions) and reader.prefix_cache.disk.rejected == 0


def test_cache_dir_errors(demo, device, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="cache_dir .*file"):
        _load(demo, device, str(blocker / "cache"))
    with pytest.raises(ValueError, match="cache_dir_bytes"):
        _load(demo, device, str(tmp_path / "c"), cache_dir_bytes=0)
    # A folder gone while serving: lookups miss, a write fails with one warning, the next one works.
    folder = str(tmp_path / "gone")
    m = _load(demo, device, folder, prefix_cache_bytes=0)
    taken = []
    m._engine.prefill(0, _ids(20, 6), snapshot_at=[5, 10], snapshots=taken)
    shutil.rmtree(folder)
    assert m.prefix_cache.longest(_ids(20, 6)) is None
    with pytest.warns(RuntimeWarning, match=f"cannot write to {folder}"):
        m.prefix_cache.disk.store(taken[0], _ids(5, 6))
        assert m.prefix_cache.disk.flush(60)
    os.makedirs(folder)
    m.prefix_cache.disk.store(taken[1], _ids(10, 6))
    assert m.prefix_cache.disk.flush(60) and m.prefix_cache.disk.write_errors == 1 and m.prefix_cache.disk.writes == 1
