"""Loading a Qwen3.5 checkpoint onto a device: options checked, the engine built, the model (one
process) or its pipeline rank (``distributed="pipeline"``) returned."""

from __future__ import annotations

import os
import sys
import time

from . import _core, arguments, gpu, pipeline, speculative as spec
from .disk_cache import DEFAULT_BUDGET as DISK_CACHE_BYTES, DiskCache, model_identity
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .dflash_checkpoint import load_drafter
from .model import Model
from .mtp_checkpoint import how_to_get_mtp
from .pipeline_model import PipelineModel
from .prefix_cache import PrefixCache
from .progress import LoadProgress
from .tokenizer import Tokenizer

__all__ = ["load"]


def _vision_tower(ckpt: Checkpoint, device: gpu.Device):
    """(the folder's vision tower on the device, "") or (None, why there is none)."""
    if ckpt.vision_config is None:
        return None, (f"{ckpt.path} has no vision tower (no vision_tower.* tensors: a text-only conversion); "
                      "images need a folder converted with mlx_vlm.convert")
    from .vision import VisionTower

    try:
        return VisionTower(ckpt, device), ""
    except CheckpointError as e:  # the language model still works without it
        return None, str(e)


def _speculation(ckpt: Checkpoint, speculative: str, mtp: bool | None, draft_depth: int | None,
                 drafter=None) -> tuple[str, bool, int]:
    """(mode, whether the MTP head loads, most drafts per verify step: 0 when "off") of load's
    checked options for this checkpoint (``drafter``: the DFlash drafter, if any)."""
    if (mtp or speculative == "mtp") and not ckpt.mtp:
        asked = "mtp=True" if mtp else "speculative='mtp'"
        raise CheckpointError(f"[checkpoint] {asked}, but {how_to_get_mtp(ckpt.path)}")
    auto = "dflash" if drafter else "mtp" if ckpt.mtp and mtp is not False else "lookup"
    mode = {"auto": auto}.get(speculative, speculative)
    with_mtp = mode == "mtp" if mtp is None else mtp
    if draft_depth is None:
        draft_depth = {"mtp": spec.DEFAULT_MTP_DEPTH, "dflash": min(drafter.block_size - 1, spec.MAX_DEPTH) if drafter
                       else 0}.get(mode, spec.DEFAULT_DEPTH)
    elif mode == "dflash" and draft_depth > drafter.block_size - 1:
        raise ValueError(f"draft_depth {draft_depth} exceeds what the drafter's block of {drafter.block_size} rows "
                         f"drafts ({drafter.block_size - 1})")
    return mode, with_mtp, draft_depth if mode != "off" else 0


def load(path: str | os.PathLike, device: str | gpu.Device | None = None, max_context: int = 4096, kv_bits: int = 8,
         prefill_chunk: int = 64, progress: bool | None = None, prefix_cache_bytes: int = 0,
         speculative: str | None = None, draft_depth: int | None = None, mtp: bool | None = None,
         mtp_hidden: str = "post_norm", max_sequences: int = 1, prefill_layers_per_buffer: int = 8,
         distributed: str | None = None, layer_split: str | None = None,
         distributed_timeout: float = 60.0, draft: str | os.PathLike | None = None,
         cache_dir: str | os.PathLike | None = None, cache_dir_bytes: int = DISK_CACHE_BYTES) -> Model:
    """Loads an MLX-format Qwen3.5 checkpoint folder.

    ``device``: "metal", "cpu", a gpu.Device, or None for the best available. ``max_context``
    bounds prompt + generated tokens (the caches are sized for it); ``kv_bits`` 8 (q8 KV
    cache) or 16 (f16). ``progress`` (default: when stderr is a terminal) shows the load,
    a first-run kernel compile and prefills longer than a second on stderr.
    ``prefix_cache_bytes`` > 0 keeps snapshots of the sequence state up to that many bytes of
    device memory (see ``prefix_cache.PrefixCache``; the server uses it).
    ``cache_dir``: a folder where the prefix cache's snapshots are also kept as files, up to
    ``cache_dir_bytes`` (default 10 GiB, least recently used removed first), so a prompt resumes
    from them after a restart (``disk_cache.DiskCache``: files are checked whole and against this
    model and engine setup; others are ignored with a warning). With ``prefix_cache_bytes`` 0
    the snapshots go to disk only.
    ``speculative``: "mtp" (drafts from the checkpoint's multi-token-prediction head, verified
    several tokens per step: see ``speculative``), "lookup" (prompt-lookup drafts), "auto"
    (MTP when the folder has a head, else lookup) or "off"; it reserves a copy of the
    recurrent state per draft row (``draft_depth`` rows at most, 1..16, default 3 with MTP, 4
    with lookup; 8 and more load the deep verify kernels, steps of up to 17 rows), which calls
    may use or not (``stream(speculative=...)``). ``mtp``: load the MTP head (its weights and a
    KV cache of max_context rows) — None: when speculation drafts with it, True: required (also
    for ``mtp_logits``), False: never. ``mtp_hidden``: the trunk
    state the head reads, "post_norm" (after the final norm, as vLLM/SGLang) or "pre_norm".
    ``max_sequences`` (1..8): sequence slots, each with its own KV cache and recurrent state
    (memory grows with it), so that a ``batching.Scheduler`` decodes up to that many
    sequences in shared steps; ``stream``/``generate`` use slot 0.
    ``prefill_layers_per_buffer``: a prefill chunk is committed as one command buffer per that
    many layers (macOS stops a buffer that holds the GPU too long); decode steps are one buffer.
    A step the GPU fails raises GpuError once and resets the sequence it ran (its tokens are
    forgotten); the model stays usable.
    ``distributed="pipeline"`` (in a script every rank of ``mlx.launch`` runs): this rank loads
    only its layers (the last rank the MTP head too; ``layer_split`` such as "0:20,20:40", one range per rank; default: in
    proportion to each rank's GPU memory) and every rank must then make the same calls, which
    return the same results; a rank that waits more than ``distributed_timeout`` seconds for
    another raises DistributedError (docs/distributed.md).
    Folders with a vision tower (mlx-vlm conversions) bring it up too, for prompts with images
    (docs/images.md); a tower that cannot be loaded leaves the model text-only (images then
    raise the reason).
    ``draft``: a DFlash drafter folder (z-lab's block-diffusion drafters, docs/speculative.md),
    checked against this model; with it ``speculative`` (default None: "dflash" with a drafter,
    else "off") "auto" or "dflash" drafts with it (up to
    ``draft_depth`` tokens a step, default its block size - 1 within the verify step's limit).
    Bad checkpoints raise CheckpointError naming the file and tensor (a drafter's: the field)."""
    if speculative is None:
        speculative = "dflash" if draft is not None else "off"
    if speculative not in ("auto", "mtp", "lookup", "dflash", "off"):
        raise ValueError(f"speculative must be 'auto', 'mtp', 'lookup', 'dflash' or 'off', got {speculative!r}")
    if draft is not None and speculative not in ("auto", "dflash"):
        raise ValueError(f"draft= is a DFlash drafter: it goes with speculative='dflash' or 'auto', "
                         f"not {speculative!r}")
    if speculative == "dflash" and draft is None:
        raise ValueError("speculative='dflash' needs draft=PATH, the DFlash drafter folder for this model")
    if draft is not None and mtp:
        raise ValueError("draft= (DFlash) and mtp=True: a model drafts with one of them")
    if mtp not in (None, True, False):
        raise ValueError(f"mtp must be None, True or False, got {mtp!r}")
    if mtp_hidden not in ("post_norm", "pre_norm"):
        raise ValueError(f"mtp_hidden must be 'post_norm' or 'pre_norm', got {mtp_hidden!r}")
    if speculative == "mtp" and mtp is False:
        raise ValueError("speculative='mtp' drafts with the MTP head: it cannot go with mtp=False")
    if isinstance(kv_bits, bool) or kv_bits not in (8, 16):
        raise ValueError(f"kv_bits must be 8 or 16, got {kv_bits!r}")
    max_context = arguments.integer("max_context", max_context, low=2, allowed="an integer >= 2")
    prefill_chunk = arguments.integer("prefill_chunk", prefill_chunk, low=1, allowed="an integer >= 1")
    prefix_cache_bytes = arguments.integer("prefix_cache_bytes", prefix_cache_bytes, low=0, allowed="bytes >= 0")
    cache_dir_bytes = arguments.integer("cache_dir_bytes", cache_dir_bytes, low=1, allowed="bytes >= 1")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir must be a folder path or None, got {type(cache_dir).__name__}")
    most = _core.MAX_SEQUENCES
    max_sequences = arguments.integer("max_sequences", max_sequences, low=1, allowed=f"an integer in 1..{most}")
    prefill_layers_per_buffer = arguments.integer("prefill_layers_per_buffer", prefill_layers_per_buffer, low=1,
                                                  allowed="an integer >= 1")
    if max_sequences > most:
        raise ValueError(f"max_sequences must be an integer in 1..{most} (one step holds at most {most} sequences), "
                         f"got {max_sequences}")
    if draft_depth is not None:
        draft_depth = arguments.integer("draft_depth", draft_depth, low=1,
                                        allowed=f"an integer in 1..{spec.MAX_DEPTH}")
        if draft_depth > spec.MAX_DEPTH:
            raise ValueError(f"draft_depth must be an integer in 1..{spec.MAX_DEPTH} (a verify step holds at "
                             f"most {spec.MAX_DEPTH + 1} rows), got {draft_depth}")
    if device is not None and not isinstance(device, (str, gpu.Device)):
        raise TypeError(f"device must be 'metal', 'cpu', a metalqwen.gpu.Device or None, got {type(device).__name__}")
    show = sys.stderr.isatty() if progress is None else bool(progress)
    if distributed is not None:
        if distributed != "pipeline":
            raise ValueError(f"distributed must be None or 'pipeline', got {distributed!r}")
        if draft is not None:
            raise ValueError(f"distributed='pipeline' does not yet take draft (not yet: {pipeline.NOT_YET})")
        if cache_dir is not None:  # each rank would keep its layers' part, the ranks agreeing on every hit
            raise ValueError("distributed='pipeline' does not yet take cache_dir (the prefix cache on disk)")
        loaded = pipeline.load_rank(
            path, device=device, max_context=max_context, kv_bits=kv_bits, prefill_chunk=prefill_chunk,
            prefill_layers_per_buffer=prefill_layers_per_buffer, layer_split=layer_split, timeout=distributed_timeout,
            speculation=lambda ckpt: _speculation(ckpt, speculative, mtp, draft_depth),
            mtp_hidden=mtp_hidden, max_sequences=max_sequences)
        return PipelineModel(loaded, show, PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None)
    if layer_split is not None:
        raise ValueError("layer_split needs distributed='pipeline'")
    started = time.perf_counter()
    ckpt = load_checkpoint(path)
    tokenizer = Tokenizer.from_folder(ckpt.path)
    dev = device if isinstance(device, gpu.Device) else gpu.Device(device)
    drafter = load_drafter(draft, ckpt.config) if draft is not None else None
    if drafter is not None and max_sequences > 1:
        raise ValueError("draft= (DFlash) does not yet work with max_sequences > 1 (docs/speculative.md)")
    mode, with_mtp, max_draft = _speculation(ckpt, speculative, mtp, draft_depth, drafter)
    desc = ckpt.describe()
    tensors = {**desc["tensors"], **desc["mtp"]} if with_mtp else desc["tensors"]
    shown = LoadProgress(dev.kind) if show else None
    try:
        engine = _core.Engine(dev._native, desc["dims"], tensors, max_context, kv_bits, prefill_chunk,
                              max_draft=max_draft, progress=shown, mtp=with_mtp, mtp_hidden=mtp_hidden,
                              max_sequences=max_sequences, prefill_layers_per_buffer=prefill_layers_per_buffer,
                              beside=desc["vision"]["tensors"] if desc["vision"] else {},
                              draft=drafter.describe() if drafter else None)
    finally:
        if shown:
            shown.close()
    disk = None
    if cache_dir is not None:
        disk = DiskCache(cache_dir, cache_dir_bytes, engine,
                         model_identity(ckpt, engine, kv_bits, mtp_hidden, dev.kind, dev.name, drafter))
    tower, no_vision = _vision_tower(ckpt, dev)
    model = Model(ckpt, tokenizer, dev, engine, progress=show,
                  prefix_cache=PrefixCache(prefix_cache_bytes, disk) if prefix_cache_bytes or disk else None,
                  speculative=mode, draft_depth=max_draft, vision=tower, no_vision=no_vision)
    if shown:
        if with_mtp:
            print(f"metalqwen: MTP head loaded ({model.mtp_bytes / 2**20:.1f} MiB of weights)", file=sys.stderr)
        peak = model.counters()["load_peak_rss"]
        print(f"metalqwen: ready in {time.perf_counter() - started:.1f} s (peak resident memory while placing "
              f"weights: {peak / 2**20:.0f} MiB)", file=sys.stderr, flush=True)
    return model
