"""Model ids from the Hugging Face Hub (hub.py), without a network: a cache laid out as
huggingface_hub writes it (models--owner--name/{blobs,snapshots/<commit>,refs/main}),
read offline (HF_HUB_OFFLINE=1) and with the Hub unreachable (this machine's case)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from metalqwen import hub
from metalqwen.checkpoint import load_checkpoint
from metalqwen.config import CheckpointError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(hf_home, repo_id: str, folder) -> str:
    """Puts `folder`'s files into the Hub cache under HF_HOME as `repo_id` at COMMIT; returns the snapshot folder."""
    repo = os.path.join(hf_home, "hub", "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", COMMIT)
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "refs"))
    os.makedirs(snapshot)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(COMMIT)
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            blob = hashlib.sha256(f.read()).hexdigest()
        shutil.copyfile(os.path.join(folder, name), os.path.join(repo, "blobs", blob))
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snapshot, name))
    return snapshot


@pytest.fixture(scope="module")
def hf_home(demo, tmp_path_factory):
    home = str(tmp_path_factory.mktemp("hf_home"))
    cache_repo(home, "owner/tiny-qwen", demo)
    return home


@pytest.fixture
def hub_env(hf_home, monkeypatch):
    # huggingface_hub reads its cache location once, at import: point it at the test's cache.
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", os.path.join(hf_home, "hub"))
    monkeypatch.setenv("HF_HOME", hf_home)
    return hf_home


@pytest.mark.parametrize("offline", ["1", "0"])
def test_a_cached_repo_id_loads_as_its_snapshot_folder(hub_env, monkeypatch, offline):
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)  # "0": the Hub cannot be reached from here
    ckpt = load_checkpoint("owner/tiny-qwen")
    assert ckpt.path == os.path.join(hub_env, "hub", "models--owner--tiny-qwen", "snapshots", COMMIT)
    assert ckpt.name == "owner/tiny-qwen"


@pytest.mark.parametrize("offline", ["1", "0"])
def test_an_id_neither_folder_nor_cached_says_so(hub_env, monkeypatch, offline):
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint("owner/not-there")
    message = str(e.value)
    assert "owner/not-there" in message and "no such folder" in message
    assert ("HF_HUB_OFFLINE is set" if offline == "1" else "the Hub cannot be reached") in message
    assert os.path.join(hub_env, "hub") in message


def test_paths_never_go_to_the_hub(hub_env, tmp_path, monkeypatch):
    import huggingface_hub

    def refuse(*a, **k):
        raise AssertionError("a path was looked up on the Hub")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    for path in [str(tmp_path / "missing"), "./owner/tiny-qwen", "a/b/c", "~/x"]:
        with pytest.raises(CheckpointError):
            load_checkpoint(path)
    os.makedirs(tmp_path / "owner" / "tiny-qwen")
    monkeypatch.chdir(tmp_path)  # a folder that exists wins over the id that reads the same
    assert hub.resolve("owner/tiny-qwen") == (str(tmp_path / "owner" / "tiny-qwen"), "tiny-qwen")


def test_the_cli_generates_from_a_cached_id_as_from_the_folder(demo, hf_home, device):
    env = {**os.environ, "HF_HOME": hf_home, "HF_HUB_OFFLINE": "1"}
    outputs = []
    for model in ("owner/tiny-qwen", demo):
        out = subprocess.run([sys.executable, "-m", "metalqwen", "generate", "-m", model, "--device", device.kind,
                              "-p", "hello", "--max-tokens", "6", "--temperature", "0"], capture_output=True, text=True, env=env,
                             timeout=600)
        assert out.returncode == 0, out.stderr
        outputs.append(out.stdout)
    assert outputs[0] == outputs[1]
    missing = subprocess.run([sys.executable, "-m", "metalqwen", "generate", "-m", "owner/absent", "-p", "x"],
                             capture_output=True, text=True, env=env, timeout=600)
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "owner/absent" in missing.stderr, missing.stderr


def test_the_server_names_the_model_by_its_id(hub_env, monkeypatch, device):
    from fastapi.testclient import TestClient

    import metalqwen
    from metalqwen.server import create_app
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = metalqwen.load("owner/tiny-qwen", device=device.kind, max_context=64)
    with TestClient(create_app(model)) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["owner/tiny-qwen"]
