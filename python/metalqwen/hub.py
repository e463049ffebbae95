"""Model ids from the Hugging Face Hub: ``load("mlx-community/Qwen3.5-9B-4bit")`` and
``-m mlx-community/...`` resolve to a snapshot folder through ``huggingface_hub``.

A path that exists is always taken as a folder. Anything else that reads as a repo id is
downloaded (only the files a checkpoint folder needs, progress on stderr, into the cache
``HF_HOME`` / ``HF_HUB_CACHE`` name), or taken from that cache when offline
(``HF_HUB_OFFLINE=1``) or when the Hub cannot be reached.
"""

from __future__ import annotations

import os

from .config import CheckpointError

# What load_checkpoint and Tokenizer.from_folder read: config and generation config, the
# weight shards and their index, the MTP sidecar, the tokenizer and the chat template.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]


def resolve(path: str | os.PathLike) -> tuple[str, str]:
    """(folder, name): an existing path as itself with its base name, else a Hub repo id's
    snapshot folder with the id as its name. CheckpointError when it is neither."""
    text = os.fspath(path)
    if os.path.exists(text) or not _looks_like_repo_id(text):
        return os.path.abspath(text), os.path.basename(os.path.normpath(os.path.abspath(text)))
    return _snapshot(text), text


def _looks_like_repo_id(text: str) -> bool:
    # "owner/name": exactly one slash, no leading . / or ~, characters the Hub allows.
    if text.startswith((".", "/", "~")) or text.count("/") != 1:
        return False
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def _snapshot(repo_id: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    try:
        return snapshot_download(repo_id, allow_patterns=CHECKPOINT_FILES, local_files_only=offline)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise CheckpointError(f"[checkpoint] {repo_id}: no such folder, and no such model on the Hugging Face "
                              f"Hub (or it is gated: log in with `hf auth login`): {_first_line(e)}") from None
    except LocalEntryNotFoundError:
        where = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        raise CheckpointError(f"[checkpoint] {repo_id}: no such folder; it reads as a Hugging Face model id, but "
                              f"{where} and the cache ({_cache_dir()}) holds no copy of it") from None


def _cache_dir() -> str:
    from huggingface_hub import constants
    return constants.HF_HUB_CACHE  # HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
