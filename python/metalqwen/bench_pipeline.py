"""`metalqwen bench --distributed pipeline` under mlx.launch: the model split over the ranks,
rank 0 measuring (the others follow its calls). Prefill tok/s and time to first token, decode
tok/s at each context (through ``Model.generate``, eos ignored), and the hops: one decode
step's rows from each rank to the next and the chosen token back to rank 0, each timed by
round trips halved (the Macs share no clock), with their share of a decode step; with
``--speculative``, decoding drafts as the model's mode says and the figures are those of its
verify steps (acceptance too). On loopback the figures only show that everything runs."""

from __future__ import annotations

import json
import sys

from .bench import EngineFigures, plan, prompt_ids, report, speculative_stats, table
from .progress import phase

HOP_REPEATS = 20  # round trips per hop


def refused(args) -> str:
    """The bench options a pipeline does not run yet ("" when none)."""
    given = {"--compare": args.compare, "--concurrency": args.concurrency, "--plot": args.plot,
             "--draft": args.draft,
             "--max-sequences": args.max_sequences}
    return ", ".join(name for name, value in given.items() if value)


def measure(model, p, vocab: int) -> tuple[EngineFigures, list[float]]:
    """Rank 0, leading: the figures, and the hops (seconds; see ``PipelineModel.hop_seconds``)."""
    figures = EngineFigures("metalqwen")
    model.eos_token_ids = []  # a fixed number of tokens, eos or not (the followers stop where rank 0 does)
    model.generate(prompt_ids(vocab, 8), max_tokens=4)  # warm-up: pipelines and first-touch pages
    for n in p.prefill_tokens:
        phase(f"metalqwen: prefill {n} tokens")
        model.reset()
        s = model.generate(prompt_ids(vocab, n), max_tokens=1).stats  # the prefill chooses the first token
        figures.prefill.append(dict(tokens=n, tokens_per_second=n / s.prompt_seconds, ttft_seconds=s.prompt_seconds))
    before = model.counters()
    for context in p.decode_contexts:
        phase(f"metalqwen: decode {p.decode_tokens} tokens at context {context}")
        model.reset()
        s = model.generate(prompt_ids(vocab, context), max_tokens=p.decode_tokens + 1).stats
        figures.decode.append(dict(context=context, tokens=p.decode_tokens,
                                   tokens_per_second=s.decode_tokens_per_second))
    counters = model.counters()
    figures.speculative = speculative_stats(before, counters)  # rank 0's engine counts every verify step
    figures.memory_bytes = counters.get("memory_estimate")
    figures.engine = {k: counters.get(k) for k in ("weight_bytes_per_token", "dispatches_last_step",
                                                    "barriers_last_step", "host_encode_us_last_step")}
    phase("metalqwen: timing the hops")
    return figures, model.hop_seconds(HOP_REPEATS)


def pipeline_figures(model, hops: list[float], figures: EngineFigures) -> dict:
    """The split and the hops, with the hops' share of a decode step at each context."""
    size, hidden = model.group.size, model.config.hidden_size
    rows = [dict(src=r, dst=r + 1, bytes=(hidden + 1) * 4, seconds=hops[r]) for r in range(size - 1)]
    rows.append(dict(src=size - 1, dst=0, bytes=4, seconds=hops[-1]))
    per_step = sum(hops)  # a decode step waits for each boundary's rows, then for the token
    shares = [dict(context=r["context"], step_seconds=1 / r["tokens_per_second"],
                   share=per_step * r["tokens_per_second"]) for r in figures.decode if r["tokens_per_second"] > 0]
    return dict(ranks=size, split=[list(r) for r in model.split], rank0_memory_bytes=figures.memory_bytes,
                hops=rows, hop_seconds_per_step=per_step, share_of_step=shares)


def lines(data: dict) -> list[str]:
    out = [f"pipeline: {data['ranks']} ranks, layers " + ", ".join(f"{a}:{b}" for a, b in data["split"])
           + " (memory GB: rank 0's)"]
    for h in data["hops"]:
        what = "one decode step's rows" if h["dst"] == h["src"] + 1 else "the chosen token"
        out.append(f"  hop rank {h['src']} -> {h['dst']} ({what}, {h['bytes']} bytes): {h['seconds'] * 1e3:.3f} ms")
    for s in data["share_of_step"]:
        out.append(f"  decode step at context {s['context']}: {s['step_seconds'] * 1e3:.2f} ms, hops "
                   f"{data['hop_seconds_per_step'] * 1e3:.3f} ms = {100 * s['share']:.1f}% of it")
    return out


def run(args) -> int:
    """The bench of a pipeline (arguments from cli.py): every rank loads its layers; rank 0 measures
    and prints, the others follow."""
    from . import gpu
    from .checkpoint import load_checkpoint
    from .loading import load

    if (names := refused(args)):
        raise ValueError(f"bench --distributed pipeline does not take {names} yet (docs/distributed.md)")
    p = plan(args.quick, args.decode_tokens, args.max_context)
    ckpt = load_checkpoint(args.model)  # a Hub id resolves here, once, to its snapshot folder
    device = args.device or gpu.Device().kind
    model = load(ckpt.path, device=device, max_context=p.max_context, kv_bits=args.kv_bits, progress=False,
                 speculative=args.speculative, distributed="pipeline", layer_split=args.layer_split,
                 distributed_timeout=args.distributed_timeout)
    measured = model.lead_with(lambda: measure(model, p, ckpt.config.vocab_size))
    if measured is None:  # a follower: rank 0 prints
        return 0
    figures, hops = measured
    data = report(args.model, device, args.kv_bits, p, figures, None, "")
    data["pipeline"] = pipeline_figures(model, hops, figures)
    print("\n".join([table(data, figures, None)] + lines(data["pipeline"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
        print(f"metalqwen: wrote {args.json}", file=sys.stderr)
    return 0
