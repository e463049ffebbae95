"""Pipeline parallelism across 2 and 3 ranks started by mlx.launch: the same tokens, logprobs and logits as one
process (prefix-cache hits included), each rank mapping only its layers, and clear errors for a bad split or a rank that
dies or hangs. Few launches, on a tiny checkpoint (each launch loads the model per rank)."""

import contextlib
import io
import os

import numpy as np
import pytest

import metalqwen
from metalqwen import cli, pipeline

from . import rank_script


@pytest.fixture(scope="module")
def single(tiny):
    """The single-process run of rank_script's "run" scenario (without a prefix cache: the cold runs)."""
    model = metalqwen.load(tiny, **rank_script.OPTIONS)
    cold = []
    for ids in rank_script.CACHED:
        model.reset()
        cold.append([[c.token, c.logprob, [list(e) for e in c.top_logprobs]]
                     for c in model.stream(ids, max_tokens=4, logprobs=3) if c.token is not None])
    return {"cached": cold,"greedy": model.generate(rank_script.PROMPT, max_tokens=5, speculative="off").tokens,
            "sampled": model.generate(rank_script.PROMPT, max_tokens=5, speculative="off",
                                      **rank_script.SAMPLED).tokens,
            "plain": model.generate(rank_script.PROMPT, max_tokens=16, speculative="off").tokens,
            "logprobs": rank_script.logprobs(model), "logits": model.score(rank_script.PROMPT),
            "weight_bytes": model.counters()["weight_bytes"]}


def range_bytes(checkpoint: str, first: int, end: int) -> int:
    """Bytes of the tensors an engine of layers [first, end) of the 4 should hold (tied embeddings)."""
    desc = metalqwen.load_checkpoint(checkpoint).describe()
    total = sum(entry[2] for layer in desc["layers"][first:end] for entry in layer["tensors"].values())
    for name, entry in desc["globals"].items():
        embed = name.startswith("language_model.model.embed_tokens.")
        if (embed and (first == 0 or end == 4)) or (not embed and end == 4):
            total += entry[2]
    return total


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_match_one_process(tiny, launch, single, ranks):
    desc = metalqwen.load_checkpoint(tiny).describe()
    even = [list(r) for r in pipeline.proportional_split(pipeline.layer_bytes(desc), [1] * ranks)]
    for rank, got in enumerate(launch(tiny, "run", ranks)):
        assert "error" not in got, got
        # Prefix-cache hits across the ranks (each rank's snapshots of its layers): a cold run's
        # tokens and logprobs; every rank kept and evicted the same snapshots (the one at 6, last used).
        assert got["reused"] == [6, 10]
        assert got["cached"] == single["cached"] and len(single["cached"][0]) == 4
        assert got["evictions"] == 1 and sorted(got["keys"]) == [10, 10, 13], got
        assert got["greedy"] == single["greedy"]
        assert got["sampled"] == single["sampled"]
        assert got["logprobs"] == single["logprobs"]
        # Speculative decoding across the ranks: plain decoding's tokens, drafts accepted and refused.
        assert got["speculative"] == single["plain"]
        assert 0 < got["accepted"] < got["drafted"], got
        assert len(single["logprobs"]) == 5 and all(lp is not None and len(top) == 3 for _, lp, top in got["logprobs"])
        logits = np.load(os.path.join(got["dir"], f"rank{rank}.npy"))
        np.testing.assert_array_equal(logits.view(np.uint32), single["logits"].view(np.uint32))
        # Equal memories: the split is even by weight bytes (2 ranks: 2 + 2 layers; 3: a middle rank
        # that neither embeds nor holds the head).
        assert got["split"] == even == ([[0, 2], [2, 4]] if ranks == 2 else [[0, 2], [2, 3], [3, 4]])
        first, end = got["layers"]
        assert got["weight_bytes"] == range_bytes(tiny, first, end) < single["weight_bytes"]


def test_batched_steps_across_ranks_match_one_process(tiny, launch):
    """generate_batch across 3 ranks (every rank calling, then rank 0 leading): a prompt read a
    chunk per shared step while another decodes, drafts accepted and refused, a third prompt
    waiting for a slot, prompts resumed from the prefix cache, a JSON schema's masks: the single
    process's generate_batch (cold), and each prompt's tokens alone."""
    alone = metalqwen.load(tiny, **rank_script.OPTIONS, max_sequences=3)
    batch = rank_script.BATCH
    greedy = [g.tokens for g in alone.generate_batch(batch, max_tokens=12, speculative="off")]
    assert greedy == [alone.generate(p, max_tokens=12, speculative="off").tokens for p in batch]
    sampled = [g.tokens for g in alone.generate_batch(batch, max_tokens=8, **rank_script.SAMPLED)]
    constrained = [g.tokens for g in alone.generate_batch(batch, max_tokens=8, json_schema=rank_script.SCHEMA)]
    led = [g.tokens for g in alone.generate_batch(batch, max_tokens=6)]
    results = launch(tiny, "batch", 3)
    for rank, got in enumerate(results):
        assert "error" not in got, got
        assert got["plain"] == got["greedy"] == greedy and got["sampled"] == sampled
        assert got["constrained"] == constrained  # the last rank masks each choice
        assert got["led"] == (led if rank == 0 else None)  # the followers return nothing
        assert 0 < got["accepted"] < got["drafted"], got
        assert got["reused"] == results[0]["reused"] and max(got["reused"]) > 0, got
        assert got["keys"] == results[0]["keys"]  # every rank kept the same snapshots


@pytest.mark.parametrize("ranks", [2, 3])
def test_moe_with_an_mtp_head_across_ranks(tiny_moe_mtp, launch, ranks):
    """The MoE checkpoint's logits and tokens, bit for bit; MTP drafts made by the last rank, fed by
    rank 0 (3 ranks: through a middle rank that neither drafts nor chooses): plain decoding's
    tokens, and the drafts and seeded draws of one process (same drafts); a JSON schema's tokens
    (the last rank masks each choice); generate_batch with MTP drafts in shared steps (made
    ahead by the last rank): the single process's generate_batch, its drafts and seeded draws,
    and each prompt's tokens alone; in lockstep and led by rank 0."""
    options = {**rank_script.OPTIONS, "speculative": "auto", "max_sequences": 3}
    alone = metalqwen.load(tiny_moe_mtp, **options)
    batch = rank_script.BATCH
    batched = alone.generate_batch(batch, max_tokens=12, speculative="mtp")
    assert [g.tokens for g in batched] == [alone.generate(p, max_tokens=12, speculative="off").tokens for p in batch]
    batched_drafts = [[g.stats.drafted, g.stats.accepted] for g in batched]
    assert all(a > 0 for _, a in batched_drafts), batched_drafts
    batched_sampled = [g.tokens for g in alone.generate_batch(batch, max_tokens=12, **rank_script.SAMPLED)]
    led_batch = [g.tokens for g in alone.generate_batch(batch, max_tokens=6)]
    plain = alone.generate(rank_script.PROMPT, max_tokens=16, speculative="off").tokens
    drafted = alone.generate(rank_script.PROMPT, max_tokens=16, speculative="mtp")
    sampled = alone.generate(rank_script.PROMPT, max_tokens=16, speculative="mtp", **rank_script.SAMPLED).tokens
    constrained = alone.generate(rank_script.PROMPT, max_tokens=12, json_schema=rank_script.SCHEMA)
    assert drafted.tokens == plain and drafted.stats.accepted > 0
    assert constrained.text.startswith('{"n"') and constrained.tokens != plain[:12], constrained.text
    results = launch(tiny_moe_mtp, "mtp", ranks)
    for rank, got in enumerate(results):
        assert "error" not in got, got
        logits = np.load(os.path.join(got["dir"], f"rank{rank}.npy"))
        np.testing.assert_array_equal(logits.view(np.uint32), alone.score(rank_script.PROMPT).view(np.uint32))
        assert got["mode"] == "mtp" and got["plain"] == got["speculative"] == plain
        assert (got["drafted"], got["accepted"]) == (drafted.stats.drafted, drafted.stats.accepted), got
        assert got["sampled"] == sampled
        assert got["constrained"] == constrained.tokens
        assert got["batched"] == [g.tokens for g in batched] and got["batched_drafts"] == batched_drafts, got
        assert got["batched_sampled"] == batched_sampled
    assert results[0]["led"] == [plain, constrained.tokens, led_batch] and all(r["led"] is None for r in results[1:])
    # The head (and the embedding it reads) on the last rank only.
    assert [r["mtp_bytes"] for r in results] == [0] * (ranks - 1) + [alone.mtp_bytes] and alone.mtp_bytes > 0
    first, end = results[-1]["layers"]
    assert end == 4 and results[-1]["weight_bytes"] == range_bytes(tiny_moe_mtp, first, end) + alone.mtp_bytes


def test_overlapping_split_refused_on_every_rank(tiny, launch):
    for got in launch(tiny, "badsplit"):
        assert got["error"] == "ValueError"
        assert "rank 1's range 2:4 must start at layer 3" in got["message"]


@pytest.mark.parametrize("scenario", ["kill", "hang"])
def test_rank_failing_mid_stream_stops_rank_0(tiny, launch, scenario):
    got = launch(tiny, scenario)[0]
    assert got["error"] == "DistributedError"
    assert got["message"].startswith("[distributed] rank 0: ")
    if scenario == "hang":
        assert f"no answer from rank 1 within {rank_script.TIMEOUT:g} s" in got["message"]
    else:
        # Whichever comes first: the ring's lost connection, or mlx.launch's SIGTERM once rank 1 is gone.
        lost = "with rank 1 failed: [ring] connection to a peer was lost" in got["message"]
        assert lost or "stopped by SIGTERM (mlx.launch sends it when another rank exits" in got["message"]
    # The bound: the timeout, plus the steps before rank 1 failed.
    assert got["seconds"] < rank_script.TIMEOUT + 10


def test_cli_generate_prints_on_rank_0_only(tiny, launch):
    alone = io.StringIO()
    with contextlib.redirect_stdout(alone), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(rank_script.cli_args(tiny)) == 0
    first, second = launch(tiny, "cli")
    assert first["code"] == second["code"] == 0, (first, second)
    assert first["stdout"] == alone.getvalue() != ""
    assert "decode: 6 tokens" in first["stderr"]  # the report
    assert second["stdout"] == second["stderr"] == ""
