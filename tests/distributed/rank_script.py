"""What each rank runs under mlx.launch in tests/distributed (not a test file): load the tiny
checkpoint with distributed="pipeline", run the scenario, write this rank's result to
<out>/rank<N>.json (and .npy for logits), since mlx.launch's exit code says nothing.

    rank_script.py CHECKPOINT OUT SCENARIO
    run       prefix-cache hits, greedy and sampled generations, logprobs, score and speculative decoding
    mtp       (the MoE checkpoint with an MTP head, max_sequences=3) score, greedy, MTP drafts and a JSON
              schema, then generate_batch of BATCH with MTP drafts (greedy, seeded sampled), in lockstep and
              led by rank 0
    batch     max_sequences=3: generate_batch of BATCH (greedy with drafts, seeded sampled, a JSON schema), in
              lockstep and led by rank 0
    badsplit  layer_split="0:3,2:4" (overlapping): refused at load
    hang      rank 1 stops answering in the middle of a stream (sleeps)
    kill      rank 1 dies (SIGKILL) in the middle of a stream
    cli       metalqwen generate --distributed pipeline (its stdout and stderr kept)
    chat      metalqwen chat --distributed pipeline, reading what mlx.launch passes on
    bench     metalqwen bench --quick --distributed pipeline --json OUT/bench.json (and the extra arguments)
    serve     metalqwen serve --distributed pipeline --port PORT (the extra argument)
    serve-hang  as serve, with rank 1 hanging in the second request it follows

Each rank writes its pid to OUT/rank<N>.pid first (the test kills what is left).
"""

import contextlib
import io
import json
import os
import signal
import sys
import time

import numpy as np

import metalqwen
from metalqwen import cli

# The same options as the single-process reference in test_pipeline.py.
OPTIONS = dict(device="cpu", max_context=64, kv_bits=16, prefill_chunk=4, progress=False, speculative="lookup")
PROMPT = [5, 17, 300, 42, 8, 99, 123, 7, 64, 250]
SAMPLED = dict(temperature=0.8, top_p=0.9, seed=7)
# The "run" scenario's prefix cache. Rank 0's part (layers 0:2, the largest with 2 or 3 ranks) of
# a snapshot at p tokens is 82432 + 1024 p bytes (a DeltaNet state, f16 K/V rows): room for the
# snapshots at 10, 10 and 13 but not also 6, so the third prompt's snapshot evicts one.
CACHE_BYTES = 2 * (82432 + 10240) + (82432 + 13312) + (82432 + 6144) // 2
# Prompts after PROMPT (snapshotted at 6 and 10): the first resumes at 6, the second at 10.
CACHED = [PROMPT[:6] + [400, 401, 402, 403], PROMPT + [11, 12, 13]]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
# The "batch" scenario's prompts: the second, read 8 tokens a step (max_rows) while the first
# decodes, repeats itself (prompt lookup drafts from it); the third waits for a slot's turn in order.
BATCH = [PROMPT, [5, 17, 300, 42, 8, 99, 5, 17, 300, 42, 8, 99, 123, 5, 17, 300, 42, 8, 99, 123, 7, 5, 17, 300,
                  42, 8, 99, 5, 17, 300], PROMPT[:4]]
TIMEOUT = 4.0  # distributed_timeout of the failure scenarios (the others: 60 s, for a loaded CI machine)


def run(model, out: str) -> dict:
    cache = cached(model)
    greedy = model.generate(PROMPT, max_tokens=5, speculative="off")
    sampled = model.generate(PROMPT, max_tokens=5, speculative="off", **SAMPLED)
    np.save(os.path.join(out, f"rank{model.rank}.npy"), model.score(PROMPT))
    plain = model.generate(PROMPT, max_tokens=16, speculative="off").tokens
    before = model.counters()
    drafted = model.generate(PROMPT, max_tokens=16, speculative=HalfRight(len(PROMPT), plain))
    after = model.counters()
    return {"greedy": greedy.tokens, "sampled": sampled.tokens, "logprobs": logprobs(model),
            "speculative": drafted.tokens, "drafted": after["drafted"] - before["drafted"],
            "accepted": after["accepted"] - before["accepted"],
            "layers": list(model.layers), **cache,
            "split": [list(r) for r in model.split], "weight_bytes": model.counters()["weight_bytes"]}


def mtp(model, out: str) -> dict:
    """The MTP head on the last rank: logits and plain tokens, then MTP speculative decoding (greedy
    and seeded sampling), a JSON schema's tokens and generate_batch with MTP drafts in shared steps
    with every rank calling, and the same greedy, constrained and batched generations with rank 0
    leading."""
    np.save(os.path.join(out, f"rank{model.rank}.npy"), model.score(PROMPT))
    plain = model.generate(PROMPT, max_tokens=16, speculative="off").tokens
    drafted = model.generate(PROMPT, max_tokens=16, speculative="mtp")
    sampled = model.generate(PROMPT, max_tokens=16, speculative="mtp", **SAMPLED).tokens
    constrained = model.generate(PROMPT, max_tokens=12, json_schema=SCHEMA).tokens
    batched = model.generate_batch(BATCH, max_tokens=12, speculative="mtp")
    batched_sampled = [g.tokens for g in model.generate_batch(BATCH, max_tokens=12, **SAMPLED)]
    led = model.lead_with(lambda: [model.generate(PROMPT, max_tokens=16).tokens,
                                   model.generate(PROMPT, max_tokens=12, json_schema=SCHEMA).tokens,
                                   [g.tokens for g in model.generate_batch(BATCH, max_tokens=6)]])
    return {"plain": plain, "speculative": drafted.tokens, "drafted": drafted.stats.drafted,
            "accepted": drafted.stats.accepted, "sampled": sampled, "constrained": constrained, "led": led,
            "batched": [g.tokens for g in batched], "batched_sampled": batched_sampled,
            "batched_drafts": [[g.stats.drafted, g.stats.accepted] for g in batched],
            "mode": model.speculative,
            "layers": list(model.layers), "mtp_bytes": model.mtp_bytes,
            "weight_bytes": model.counters()["weight_bytes"]}


def batch(model, out: str) -> dict:
    """generate_batch of BATCH across the ranks: plain, greedy with drafts, seeded sampled (prompts resumed
    from the prefix cache), under a JSON schema, then led by rank 0."""
    plain = [g.tokens for g in model.generate_batch(BATCH, max_tokens=12, speculative="off")]
    before = model.counters()
    greedy = [g.tokens for g in model.generate_batch(BATCH, max_tokens=12, speculative=HalfRight.of(BATCH, plain))]
    after = model.counters()
    sampled = model.generate_batch(BATCH, max_tokens=8, **SAMPLED)
    constrained = [g.tokens for g in model.generate_batch(BATCH, max_tokens=8, json_schema=SCHEMA)]
    led = model.lead_with(lambda: [g.tokens for g in model.generate_batch(BATCH, max_tokens=6)])
    return {"plain": plain, "greedy": greedy, "sampled": [g.tokens for g in sampled], "led": led,
            "constrained": constrained,
            "reused": [g.stats.prompt_tokens_reused for g in sampled],
            "keys": sorted(len(k) for k in model.prefix_cache.keys()),
            "drafted": after["drafted"] - before["drafted"],
            "accepted": after["accepted"] - before["accepted"]}


def cached(model) -> dict:
    """PROMPT with a snapshot at 6 (and its end), then the CACHED prompts resuming from the cache:
    their greedy tokens and logprobs, tokens reused, and the cache's keys and evictions."""
    model.generate(PROMPT, max_tokens=3, speculative="off", boundaries=[6])
    streams, reused = [], []
    for ids in CACHED:
        streams.append([[c.token, c.logprob, [list(e) for e in c.top_logprobs]]
                        for c in model.stream(ids, max_tokens=4, logprobs=3) if c.token is not None])
        reused.append(model.last_stats.prompt_tokens_reused)
    cache = model.prefix_cache
    return {"cached": streams, "reused": reused, "evictions": cache.evictions,
            "keys": [len(k) for k in cache.keys()]}


class HalfRight:
    """A drafter that knows the greedy answer (``plain``, after a prompt of ``prompt`` tokens) and
    gets its second draft wrong: each verify step of k >= 2 drafts accepts one (the random tiny
    model repeats nothing prompt lookup could draft from)."""

    def __init__(self, prompt: int, plain: list[int]):
        self.prompt, self.plain = prompt, plain

    @staticmethod
    def of(prompts: list[list[int]], plains: list[list[int]]):
        """One drafter for several prompts (generate_batch's): each history's own HalfRight."""
        known = {tuple(p): HalfRight(len(p), plain) for p, plain in zip(prompts, plains)}

        class Batch:
            def draft(self, history, k):
                return next(d for p, d in known.items() if tuple(history[:len(p)]) == p).draft(history, k)

        return Batch()

    def draft(self, history, k):
        drafts = list(self.plain[len(history) - self.prompt:][:k])
        if len(drafts) >= 2:
            drafts[1] = (drafts[1] + 1) % 1000
        return drafts


def logprobs(model) -> list:
    """[token, logprob, top 3] of each chunk of a seeded sampled stream (JSON keeps the floats exactly)."""
    return [[c.token, c.logprob, [list(e) for e in c.top_logprobs]]
            for c in model.stream(PROMPT, max_tokens=5, logprobs=3, **SAMPLED) if c.token is not None]


def fail_mid_stream(model, scenario: str) -> dict:
    """Rank 1 fails after the second token; the others must raise DistributedError."""
    for n, _ in enumerate(model.stream(PROMPT, max_tokens=8)):
        if n == 1 and model.rank == 1:
            if scenario == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # mlx.launch SIGTERMs this rank once rank 0 has given up
    return {}


def cli_args(path: str) -> list[str]:
    """``metalqwen generate`` as test_pipeline.py runs it alone (plus --distributed pipeline here)."""
    return ["generate", "-m", path, "--device", "cpu", "--max-context", "64", "--kv-bits", "16", "--raw", "-p",
            "Hello", "--max-tokens", "6", "--temperature", "0"]


def chat_args(path: str) -> list[str]:
    """``metalqwen chat`` as test_commands.py runs it alone (plus --distributed pipeline here)."""
    return ["chat", "-m", path, "--device", "cpu", "--max-context", "64", "--kv-bits", "16", "--max-tokens", "4",
            "--temperature", "0", "--no-think"]


def serve_args(path: str, port: str, timeout: float) -> list[str]:
    return ["serve", "-m", path, "--device", "cpu", "--max-context", "64", "--kv-bits", "16", "--port", port,
            "--log-level", "warning", "--distributed", "pipeline", "--distributed-timeout", str(timeout)]


def hang_in_second_request() -> None:
    """Rank 1 of serve-hang: the round that brings it the second request sleeps (mlx.launch SIGTERMs it
    once rank 0 exits)."""
    from metalqwen.pipeline_rounds import FollowingRounds

    follow, submitted = FollowingRounds.round, []

    def hanging(self, message):
        submitted.extend(c for c in message["changes"] if c[0] == "submit")
        if len(submitted) == 2:
            time.sleep(60)
        follow(self, message)

    FollowingRounds.round = hanging


def command(path: str, out: str, scenario: str, extra: list[str]) -> list[str]:
    if scenario == "cli":
        return cli_args(path) + ["--distributed", "pipeline"]
    if scenario == "chat":
        return chat_args(path) + ["--distributed", "pipeline"]
    if scenario == "bench":
        return ["bench", "-m", path, "--device", "cpu", "--kv-bits", "16", "--quick", "--decode-tokens", "4",
                "--distributed", "pipeline", "--json", os.path.join(out, "bench.json"), *extra]
    if scenario == "serve-hang" and os.environ["MLX_RANK"] == "1":
        hang_in_second_request()
    return serve_args(path, extra[0], TIMEOUT if scenario == "serve-hang" else 60)


def run_cli(path: str, out: str, scenario: str, extra: list[str]) -> int:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(command(path, out, scenario, extra))
    with open(os.path.join(out, f"rank{os.environ['MLX_RANK']}.json"), "w") as f:
        json.dump({"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}, f)
    return code


def main(path: str, out: str, scenario: str, *extra: str) -> int:
    with open(os.path.join(out, f"rank{os.environ['MLX_RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if scenario in ("cli", "chat", "bench", "serve", "serve-hang"):
        return run_cli(path, out, scenario, list(extra))
    rank = int(os.environ.get("MLX_RANK", "-1"))
    started = time.monotonic()
    try:
        options = {**OPTIONS, "speculative": "auto"} if scenario == "mtp" else OPTIONS
        if scenario in ("batch", "mtp"):
            options = {**options, "max_sequences": 3}
        model = metalqwen.load(path, **options, distributed="pipeline",
                               prefix_cache_bytes={"run": CACHE_BYTES, "batch": 2**20}.get(scenario, 0),
                               distributed_timeout=TIMEOUT if scenario in ("hang", "kill") else 60,
                               layer_split="0:3,2:4" if scenario == "badsplit" else None)
        rank = model.rank
        started = time.monotonic()
        scenarios = {"run": run, "mtp": mtp, "batch": batch}
        result = scenarios[scenario](model, out) if scenario in scenarios else fail_mid_stream(model, scenario)
    except Exception as e:  # reported in the result file
        result = {"error": type(e).__name__, "message": str(e)}
    result["seconds"] = time.monotonic() - started
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
