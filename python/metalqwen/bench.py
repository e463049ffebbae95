"""`metalqwen bench -m FOLDER`: end-to-end speed of a checkpoint — prefill tok/s and time to
first token at 512 and 4096 prompt tokens, decode tok/s at 0, 4K and 16K tokens of context,
memory — and, with ``--concurrency 1,2,4,8``, the aggregate decode tok/s of that many
prompts decoded together in shared steps (``Model.generate_batch``); with ``--compare
mlx-lm``, mlx-lm's figures on the same folder, prompts and settings in the same process, side
by side with the ratio.

Both engines get the same prompt (ids drawn from the checkpoint's vocabulary) and decode
greedily for a fixed number of tokens, eos or not. Time to first token is the prefill of the
whole prompt plus the choice of the first token; decode tok/s excludes it. Context 0 means a
one-token prompt. A concurrency level c decodes c different prompts of the same length at
once; its aggregate tok/s is every stream's decode tokens over the wall time of the run less
the first prompt's prefill (the later prompts join the shared steps a chunk per step, beside the
streams decoding: their time counts as decode time, as the running streams see it). On the CPU
runtime the figures only show that everything runs.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from . import _core, speculative as spec
from .progress import phase

PREFILL_TOKENS = (512, 4096)
DECODE_CONTEXTS = (0, 4096, 16384)
DECODE_TOKENS = 128
# --quick: sizes that run in seconds on the CPU runtime with the tiny test checkpoints.
QUICK_PREFILL_TOKENS = (32, 64)
QUICK_DECODE_CONTEXTS = (0, 64)
QUICK_DECODE_TOKENS = 8
CONCURRENCY_PROMPT_TOKENS = 512  # each stream's prompt at every concurrency level
QUICK_CONCURRENCY_PROMPT_TOKENS = 32


@dataclass
class Plan:
    """What to measure: prompt sizes, decode contexts, tokens per decode run, concurrency
    levels (1 first, the baseline; none: not measured) with their prompt size, and the notes
    saying what was changed to fit max_context."""

    prefill_tokens: list[int]
    decode_contexts: list[int]
    decode_tokens: int
    max_context: int
    notes: list[str] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=list)
    concurrency_prompt: int = 0


@dataclass
class EngineFigures:
    """One engine's results; ``prefill`` and ``decode`` are lists of dicts (see ``_prefill`` / ``_decode``)."""

    name: str
    load_seconds: float = 0.0
    prefill: list[dict] = field(default_factory=list)  # {tokens, tokens_per_second, ttft_seconds}
    decode: list[dict] = field(default_factory=list)  # {context, tokens, tokens_per_second}
    memory_bytes: int | None = None
    engine: dict = field(default_factory=dict)  # metalqwen's counters per step
    speculative: dict | None = None
    concurrency: list[dict] = field(default_factory=list)  # see ``concurrency_level``


def concurrency_levels(text: str | None) -> list[int]:
    """``--concurrency 2,4,8`` -> [1, 2, 4, 8] (level 1 is the baseline of the ratios); None -> []."""
    most = _core.MAX_SEQUENCES
    if text is None:
        return []
    try:
        levels = {int(t) for t in text.split(",")}
    except ValueError:
        levels = set()
    if not levels or not all(1 <= c <= most for c in levels):
        raise ValueError(f"--concurrency must be comma-separated integers in 1..{most} (sequences decoded "
                         f"together), got {text!r}")
    return sorted(levels | {1})


def plan(quick: bool, decode_tokens: int | None, max_context: int | None, concurrency: list[int] = ()) -> Plan:
    """The sizes to run, clamped to ``max_context`` when one is given (each change noted)."""
    prefill = list(QUICK_PREFILL_TOKENS if quick else PREFILL_TOKENS)
    contexts = list(QUICK_DECODE_CONTEXTS if quick else DECODE_CONTEXTS)
    tokens = decode_tokens or (QUICK_DECODE_TOKENS if quick else DECODE_TOKENS)
    levels = list(concurrency)
    prompt = (QUICK_CONCURRENCY_PROMPT_TOKENS if quick else CONCURRENCY_PROMPT_TOKENS) if levels else 0
    # A prompt plus the token it chooses; a context (or a concurrency prompt), the one-token
    # prompt at 0 and the decoded tokens.
    needed = max(max(prefill) + 1, max(contexts + [prompt]) + 1 + tokens)
    if max_context is None or max_context >= needed:
        return Plan(prefill, contexts, tokens, max_context or needed, [], levels, prompt)
    notes = []
    fit_prefill = sorted({min(n, max_context - 1) for n in prefill})
    if fit_prefill != prefill:
        notes.append(f"prefill sizes {prefill} clamped to {fit_prefill} (max_context {max_context})")
    room = max_context - 1 - tokens
    if room < 0:
        raise ValueError(f"--max-context {max_context} leaves no room for {tokens} decoded tokens")
    fit_contexts = sorted({min(c, room) for c in contexts})
    if fit_contexts != contexts:
        notes.append(f"decode contexts {contexts} clamped to {fit_contexts} (max_context {max_context} - "
                     f"{tokens} decoded tokens)")
    if prompt > room:
        notes.append(f"concurrency prompts of {prompt} tokens clamped to {room} (max_context {max_context} - "
                     f"{tokens} decoded tokens)")
        prompt = room
    return Plan(fit_prefill, fit_contexts, tokens, max_context, notes, levels, prompt)


def prompt_ids(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    """The same prompt for every engine: ids from the checkpoint's own vocabulary (the first
    10000 at most: ordinary text tokens in real checkpoints); another ``seed``, another prompt."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, min(vocab_size, 10000), max(n, 1))]


def concurrency_prompts(vocab_size: int, p: Plan, c: int) -> list[list[int]]:
    """The c different prompts of concurrency level c (the same for every engine)."""
    return [prompt_ids(vocab_size, p.concurrency_prompt, seed) for seed in range(c)]


def concurrency_level(c: int, tokens: int, seconds: float, steps: int, **extra) -> dict:
    """One concurrency level's figures: ``tokens`` decoded over all streams in ``seconds`` of
    decoding, by ``steps`` decode steps (``speedup`` is set once level 1 is known)."""
    return dict(concurrency=c, tokens=tokens, seconds=seconds, steps=steps, tokens_per_second=tokens / seconds,
                per_stream_tokens_per_second=tokens / seconds / c, **extra)


def set_speedups(levels: list[dict]) -> None:
    """Aggregate tok/s of each level over that of level 1 (the first)."""
    for r in levels:
        r["speedup"] = r["tokens_per_second"] / levels[0]["tokens_per_second"]


# ---------------------------------------------------------------------------------------- metalqwen


def run_metalqwen(folder: str, device: str | None, kv_bits: int, p: Plan, vocab: int,
                  speculative: str | None = "off", max_sequences: int = 1, draft: str | None = None) -> EngineFigures:
    from .loading import load

    figures = EngineFigures("metalqwen")
    phase("metalqwen: loading")
    start = time.perf_counter()
    model = load(folder, device=device, max_context=p.max_context, kv_bits=kv_bits, progress=False,
                 speculative=speculative, max_sequences=max_sequences, draft=draft)
    figures.load_seconds = time.perf_counter() - start
    engine = model.runner.engine
    _metalqwen_decode(model, prompt_ids(vocab, 8), 4)  # warm-up: pipelines and first-touch pages
    for n in p.prefill_tokens:
        phase(f"metalqwen: prefill {n} tokens")
        engine.reset(0)
        start = time.perf_counter()
        engine.prefill(0, prompt_ids(vocab, n))
        engine.decode_begin(0, 1)
        engine.decode_next()  # the first token, chosen by the prefill's last chunk
        engine.decode_end()
        seconds = time.perf_counter() - start
        figures.prefill.append(dict(tokens=n, tokens_per_second=n / seconds, ttft_seconds=seconds))
    before = model.counters()
    for context in p.decode_contexts:
        phase(f"metalqwen: decode {p.decode_tokens} tokens at context {context}")
        seconds = _metalqwen_decode(model, prompt_ids(vocab, context), p.decode_tokens)
        figures.decode.append(dict(context=context, tokens=p.decode_tokens,
                                   tokens_per_second=p.decode_tokens / seconds))
    after = model.counters()
    figures.memory_bytes = after.get("memory_estimate")
    figures.engine = {k: after.get(k) for k in ("weight_bytes_per_token", "dispatches_last_step",
                                                 "barriers_last_step", "host_encode_us_last_step")}
    figures.speculative = speculative_stats(before, after)
    if p.concurrency:
        figures.concurrency = _metalqwen_concurrency(model, p, vocab)
    return figures


def _metalqwen_decode(model, prompt: list[int], tokens: int) -> float:
    """Seconds to decode ``tokens`` tokens after ``prompt`` (fed first, not timed), eos or not:
    plainly, or by the model's speculative mode (greedy)."""
    from . import _core

    engine = model.runner.engine
    engine.reset(0)
    engine.prefill(0, prompt)
    if model.speculative != "off":
        drafter = {"mtp": spec.MtpHead, "dflash": spec.DflashBlock}.get(model.speculative, spec.PromptLookup)()
        steps = spec.generate(engine, 0, engine.chosen(0), tokens + 1, _core.Sampling(), drafter,
                              spec.policy_for(drafter, model.draft_depth), history=list(prompt))
        next(steps)  # the prefill's choice: not a decode step
        start = time.perf_counter()
        for _ in steps:
            pass
        return time.perf_counter() - start
    engine.decode_begin(0, tokens + 1)
    engine.decode_next()  # the prefill's choice: not a decode step
    start = time.perf_counter()
    while engine.decode_next() is not None:
        pass
    engine.decode_end()
    return time.perf_counter() - start


def _metalqwen_concurrency(model, p: Plan, vocab: int) -> list[dict]:
    """Each level's prompts through ``generate_batch`` (the model's speculative mode, greedy).
    The first prompt is fed alone; each later one joins the shared steps a chunk per step, beside
    the streams already decoding, so those steps count as decode steps and their time as decode
    time (as the running streams see it). Decode time is the run's wall time less the first
    prompt's prefill; decode steps the run's command buffers less its chunks; pipelined steps
    those committed while the step before was still running (the host did not wait between them)."""
    model.eos_token_ids = []  # a fixed number of tokens, eos or not, as in the other decode runs
    engine = model.runner.engine
    engine.reset(0)
    before = model.counters()
    engine.prefill(0, concurrency_prompts(vocab, p, 1)[0])
    prompt_steps = model.counters()["steps"] - before["steps"]
    model.generate_batch([prompt_ids(vocab, 8, seed) for seed in range(p.concurrency[-1])], 2)  # warm-up: every slot
    levels = []
    for c in p.concurrency:
        phase(f"metalqwen: {c} prompts of {p.concurrency_prompt} tokens, {p.decode_tokens} tokens each, together")
        before = model.counters()
        start = time.perf_counter()
        runs = model.generate_batch(concurrency_prompts(vocab, p, c), p.decode_tokens + 1)
        seconds = time.perf_counter() - start
        after = model.counters()
        prefill = runs[0].stats.prompt_seconds  # the others' chunks ran inside shared steps
        tokens = sum(r.stats.generated_tokens - 1 for r in runs)  # each stream's first token comes from its prompt
        steps = after["steps"] - before["steps"] - prompt_steps
        levels.append(concurrency_level(c, tokens, seconds - prefill, steps, prefill_seconds=prefill,
                                        pipelined_steps=after["pipelined_steps"] - before["pipelined_steps"],
                                        speculative=speculative_stats(before, after)))
    set_speedups(levels)
    return levels


def speculative_stats(before: dict, after: dict) -> dict | None:
    """Over the decode runs when they speculated: verify steps, drafts, tokens per verify step
    and acceptance (overall and per depth); None otherwise."""
    from .generation import GenerationStats, count_speculation

    s = GenerationStats()
    count_speculation(s, before, after)
    if not s.verify_steps:
        return None
    return dict(verify_steps=s.verify_steps, drafted=s.drafted, accepted=s.accepted,
                tokens_per_verify_step=s.tokens_per_verify_step, acceptance=s.acceptance if s.drafted else None,
                acceptance_by_depth=[round(a, 3) if d else None for a, d in zip(s.acceptance_at, s.drafted_at)])


# ---------------------------------------------------------------------------------------- mlx-lm


def mlx_lm_missing() -> str:
    """Why mlx-lm cannot run here ("" when it can)."""
    try:
        import mlx_lm  # noqa: F401
    except ImportError as e:
        return f"mlx-lm is not installed ({e.name} missing): pip install mlx-lm"
    return ""


def mlx_lm_batch_missing() -> str:
    """Why mlx-lm cannot run the concurrency levels ("" when it can: a BatchGenerator with stats)."""
    try:
        from mlx_lm.generate import BatchGenerator
    except ImportError:
        BatchGenerator = None
    if not hasattr(BatchGenerator, "stats"):
        return "concurrency skipped: this mlx-lm has no BatchGenerator with stats (pip install -U mlx-lm)"
    return ""


def run_mlx_lm(folder: str, p: Plan, vocab: int) -> EngineFigures:
    """mlx-lm on the same folder: its own load and generate_step (greedy, its default KV cache);
    the concurrency levels by its BatchGenerator."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    figures = EngineFigures("mlx-lm")
    phase("mlx-lm: loading")
    start = time.perf_counter()
    model, tokenizer = load(folder)
    figures.load_seconds = time.perf_counter() - start

    def timed(prompt: list[int], tokens: int) -> tuple[float, float]:
        """(seconds to the first token, seconds for the tokens after it)."""
        start = time.perf_counter()
        steps = generate_step(mx.array(prompt), model, max_tokens=tokens + 1)
        next(steps)
        first = time.perf_counter()
        for _ in steps:
            pass
        return first - start, time.perf_counter() - first

    timed(prompt_ids(vocab, 8), 4)  # warm-up
    for n in p.prefill_tokens:
        phase(f"mlx-lm: prefill {n} tokens")
        ttft, _ = timed(prompt_ids(vocab, n), 0)
        figures.prefill.append(dict(tokens=n, tokens_per_second=n / ttft, ttft_seconds=ttft))
    for context in p.decode_contexts:
        phase(f"mlx-lm: decode {p.decode_tokens} tokens at context {context}")
        _, seconds = timed(prompt_ids(vocab, context), p.decode_tokens)
        figures.decode.append(dict(context=context, tokens=p.decode_tokens,
                                   tokens_per_second=p.decode_tokens / seconds))
    figures.memory_bytes = int(mx.get_peak_memory()) if hasattr(mx, "get_peak_memory") else None
    if p.concurrency:
        figures.concurrency = _mlx_lm_concurrency(model, p, vocab)
    return figures


def _mlx_lm_concurrency(model, p: Plan, vocab: int) -> list[dict]:
    """Each level's prompts through mlx-lm's BatchGenerator (greedy, what its batch_generate
    runs), timed by its own stats: generation tokens and steps over the wall time less prompt
    time (its first step feeds each prompt's last token, so each stream's first token counts)."""
    from mlx_lm.generate import BatchGenerator

    def batch(prompts: list[list[int]], tokens: int):
        gen = BatchGenerator(model, stop_tokens=[])  # a fixed number of tokens, eos or not
        try:
            gen.insert(prompts, [tokens] * len(prompts))
            with gen.stats() as stats:
                while gen.next_generated():
                    pass
        finally:
            gen.close()
        return stats

    batch([prompt_ids(vocab, 8, seed) for seed in range(p.concurrency[-1])], 2)  # warm-up
    levels = []
    for c in p.concurrency:
        phase(f"mlx-lm: {c} prompts of {p.concurrency_prompt} tokens, {p.decode_tokens} tokens each, together")
        s = batch(concurrency_prompts(vocab, p, c), p.decode_tokens + 1)
        levels.append(concurrency_level(c, s.generation_tokens, s.generation_time, s.generation_steps,
                                        prefill_seconds=s.prompt_time))
    set_speedups(levels)
    return levels


# ---------------------------------------------------------------------------------------- report


def report(folder: str, device: str, kv_bits: int, p: Plan, ours: EngineFigures, theirs: EngineFigures | None,
           skipped: str, max_sequences: int = 1) -> dict:
    """Everything measured, as the JSON file holds it (each engine's concurrency levels in its
    figures; what they ran in ``concurrency``)."""
    concurrency = dict(levels=p.concurrency, prompt_tokens=p.concurrency_prompt, tokens_per_stream=p.decode_tokens,
                       max_sequences=max_sequences) if p.concurrency else None
    return dict(model=folder, device=device, kv_bits=kv_bits, decode_tokens=p.decode_tokens,
                max_context=p.max_context, notes=p.notes, concurrency=concurrency, metalqwen=asdict(ours),
                mlx_lm=asdict(theirs) if theirs else None, mlx_lm_skipped=skipped or None,
                ratios=ratios(ours, theirs) if theirs else None)


def _rows(figures: EngineFigures) -> dict[str, float]:
    """The comparable figures by row label (tok/s, seconds)."""
    rows = {}
    for r in figures.prefill:
        rows[f"prefill {r['tokens']} tok/s"] = r["tokens_per_second"]
        rows[f"time to first token at {r['tokens']}, s"] = r["ttft_seconds"]
    for r in figures.decode:
        rows[f"decode at context {r['context']} tok/s"] = r["tokens_per_second"]
    for r in figures.concurrency:
        c = r["concurrency"]
        rows[f"aggregate decode, {c} stream{'s' if c > 1 else ''} tok/s"] = r["tokens_per_second"]
    return rows


def ratios(ours: EngineFigures, theirs: EngineFigures) -> dict[str, float]:
    """metalqwen / mlx-lm per row (above 1: metalqwen is faster, for times as well)."""
    a, b = _rows(ours), _rows(theirs)
    return {k: (b[k] / a[k] if k.endswith(", s") else a[k] / b[k]) for k in a if k in b and a[k] > 0 and b[k] > 0}


def table(data: dict, ours: EngineFigures, theirs: EngineFigures | None) -> str:
    lines = [f"metalqwen bench: {data['model']} on {data['device']} (kv {data['kv_bits']}-bit, greedy, "
             f"{data['decode_tokens']} tokens per decode run)"]
    lines += [f"note: {n}" for n in data["notes"]]
    if data["device"] == "cpu":
        lines.append("note: the CPU runtime is a test backend: its figures say nothing about an Apple GPU")
    ours_rows, theirs_rows = _rows(ours), _rows(theirs) if theirs else {}
    width = max(len(k) for k in ours_rows) + 2
    head = f"{'':{width}}{'metalqwen':>12}"
    if theirs:
        head += f"{'mlx-lm':>12}{'ratio':>9}"
    lines.append(head)
    for label, value in ours_rows.items():
        line = f"{label:{width}}{value:12.2f}"
        if theirs and label in theirs_rows:
            ratio = data["ratios"].get(label)
            line += f"{theirs_rows[label]:12.2f}" + (f"{ratio:8.2f}x" if ratio else f"{'-':>9}")
        lines.append(line)
    # metalqwen: the estimate the load was admitted with; mlx-lm: its peak allocation.
    gb = [f"{f.memory_bytes / 1e9:12.2f}" if f and f.memory_bytes else f"{'-':>12}" for f in (ours, theirs)]
    lines.append(f"{'memory GB':{width}}{gb[0]}" + (gb[1] if theirs else ""))
    e = ours.engine
    if e.get("dispatches_last_step") is not None:
        lines.append(f"metalqwen decode step: {e['dispatches_last_step']} dispatches, {e['barriers_last_step']} "
                     f"barriers, {e['host_encode_us_last_step']:.0f} us host encode, "
                     f"{e['weight_bytes_per_token'] / 1e6:.1f} MB of weights per token")
    if ours.speculative:
        lines.append("speculative: " + _speculation(ours.speculative))
    if data["concurrency"]:
        lines += _concurrency_lines(data["concurrency"], [f for f in (ours, theirs) if f])
    if data["mlx_lm_skipped"]:
        lines.append(f"mlx-lm: skipped: {data['mlx_lm_skipped']}")
    if theirs:
        lines.append("ratio: metalqwen / mlx-lm for tok/s, mlx-lm / metalqwen for seconds (above 1: metalqwen is "
                     "faster); memory: metalqwen's estimate at load, mlx-lm's peak allocation")
    return "\n".join(lines)


def _speculation(figures: dict) -> str:
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()
                     if v is not None)


def _concurrency_lines(run: dict, engines: list[EngineFigures]) -> list[str]:
    """The concurrency section: per engine and level, aggregate and per-stream tok/s, the
    ratio to one stream, and decode steps against decode tokens (metalqwen's: how many pipelined)."""
    lines = [f"concurrency: c prompts of {run['prompt_tokens']} tokens decoded together, {run['tokens_per_stream']} "
             f"tokens each (metalqwen: generate_batch, {run['max_sequences']} sequence slots, counted in its memory)"]
    for e in engines:
        for r in e.concurrency:
            lines.append(f"  {e.name:10s} c={r['concurrency']}: {r['tokens_per_second']:10.2f} tok/s aggregate, "
                         f"{r['per_stream_tokens_per_second']:8.2f} per stream, {r['speedup']:5.2f}x one stream, "
                         f"{r['steps']} decode steps for {r['tokens']} tokens"
                         + (f" ({r['pipelined_steps']} pipelined)" if "pipelined_steps" in r else ""))
            if r.get("speculative"):
                lines.append(f"  {'':10s}      speculative: {_speculation(r['speculative'])}")
    return lines


def plot_missing() -> str:
    """Why --plot cannot draw here ("" when it can)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib: pip install 'metalqwen[plot]' (or pip install matplotlib)"
    return ""


def plot(path: str, data: dict, engines: list[EngineFigures]) -> None:
    """Decode tok/s against context, one line per engine; beside it, with concurrency levels,
    aggregate decode tok/s against the streams decoded together."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("decode", "context", "context (tokens)", "decode tok/s")]
    if data["concurrency"]:
        panels.append(("concurrency", "concurrency", "streams decoded together", "aggregate decode tok/s"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (figures, x, xlabel, ylabel) in zip(axes[0], panels):
        for e in engines:
            rows = getattr(e, figures)
            ax.plot([r[x] for r in rows], [r["tokens_per_second"] for r in rows], marker="o", label=e.name)
        if figures == "concurrency":
            ax.set_xticks(data["concurrency"]["levels"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{data['model']} on {data['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    """The `metalqwen bench` command (arguments from cli.py)."""
    from . import gpu
    from .checkpoint import load_checkpoint

    if args.plot and (missing := plot_missing()):
        raise ValueError(missing)
    p = plan(args.quick, args.decode_tokens, args.max_context, concurrency_levels(args.concurrency))
    max_sequences = args.max_sequences or (p.concurrency[-1] if p.concurrency else 1)
    if p.concurrency and max_sequences < p.concurrency[-1]:
        raise ValueError(f"--max-sequences {max_sequences} is less than the largest --concurrency level "
                         f"{p.concurrency[-1]}")
    if args.draft is not None and max_sequences > 1:
        raise ValueError(f"--draft (DFlash) does not batch yet: it measures one sequence (leave out --concurrency "
                         f"levels above 1 and --max-sequences), got {max_sequences} sequences")
    ckpt = load_checkpoint(args.model)  # a Hub id resolves here, once, to its snapshot folder
    vocab = ckpt.config.vocab_size
    device = args.device or gpu.Device().kind
    # Said before the (long) metalqwen half, not found out after it.
    skipped = mlx_lm_missing() if args.compare == "mlx-lm" else ""
    if skipped:
        phase(f"mlx-lm: will be skipped: {skipped}")
    ours = run_metalqwen(ckpt.path, device, args.kv_bits, p, vocab, args.speculative, max_sequences, args.draft)
    theirs = None
    if args.compare == "mlx-lm":
        if not skipped:
            batch_missing = mlx_lm_batch_missing() if p.concurrency else ""
            if batch_missing:
                p.notes.append(f"mlx-lm: {batch_missing}")
            theirs = run_mlx_lm(ckpt.path, replace(p, concurrency=[]) if batch_missing else p, vocab)
    data = report(args.model, device, args.kv_bits, p, ours, theirs, skipped, max_sequences)
    print(table(data, ours, theirs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
        print(f"metalqwen: wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(args.plot, data, [e for e in (ours, theirs) if e])
        print(f"metalqwen: wrote {args.plot}", file=sys.stderr)
    return 0
