"""GPU failures, injected on the CPU runtime (METALQWEN_CPU_FAULTS=cb:N): the N-th command buffer
fails and so do the ones queued behind it, as on Metal. The step that waited for it resets the
sequences it ran and raises GpuError once; the same request then gives the clean run's tokens.
Also the bound on a prefill chunk's command buffers (load(prefill_layers_per_buffer=...))."""

import httpx
import numpy as np
import pytest

import metalqwen
from metalqwen import gpu
from metalqwen.batching import Scheduler
from metalqwen.errors import GpuError
from metalqwen.server import create_app

from ..support.server_fixtures import LiveServer

# With prefill_chunk 8 the prompt is two chunks (8 + 2 rows): command buffers 1-2 of a fresh model.
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
OTHER = [7, 3, 9]  # one chunk
OPTIONS = dict(device="cpu", max_context=32, prefill_chunk=8, progress=False)


def load(demo, monkeypatch, fault=None, **options):
    """The demo model on a new CPU device whose `fault`-th command buffer fails (None: none)."""
    if fault is None:
        monkeypatch.delenv("METALQWEN_CPU_FAULTS", raising=False)
    else:
        monkeypatch.setenv("METALQWEN_CPU_FAULTS", f"cb:{fault}")
    return metalqwen.load(demo, **OPTIONS, **options)


class Clean:
    """Fault-free reference runs of the same model."""

    def __init__(self, demo):
        self.model = metalqwen.load(demo, **OPTIONS)
        self._runs = {}

    def generation(self, prompt, n):
        if (tuple(prompt), n) not in self._runs:
            self.model.reset()
            self._runs[tuple(prompt), n] = self.model.generate(prompt, max_tokens=n)
        return self._runs[tuple(prompt), n]

    def __call__(self, prompt, n):
        return self.generation(prompt, n).tokens


@pytest.fixture(scope="module")
def clean(demo):
    return Clean(demo)


def assert_reset(model, slot=0):
    engine = model._engine
    assert engine.position(slot) == 0 and engine.tokens(slot) == []


# ---------------------------------------------------------------- the CPU runtime's injected faults

PUT = """#include <metal_stdlib>
using namespace metal;
kernel void put(device uint* out [[buffer(0)]], constant uint& value [[buffer(1)]],
                uint i [[thread_position_in_grid]]) {
    out[i] = value;
}
"""


def test_the_nth_buffer_fails_part_way_and_the_ones_queued_behind_it_until_a_wait_reports_it(monkeypatch):
    monkeypatch.setenv("METALQWEN_CPU_FAULTS", "cb:2")
    dev = gpu.Device("cpu")
    put = dev.compile(PUT, "put.metal").kernel("put")

    def commit(out):  # four dispatches, each writing its number into its word of `out`
        cb = dev.command_buffer()
        for k in range(4):
            cb.dispatch_threads(put, {0: (out, 4 * k), 1: np.uint32(k + 1)}, grid=1, threads=1)
        cb.commit()
        return cb

    outs = [dev.buffer(np.zeros(4, np.uint32)) for _ in range(4)]
    first, failing, behind = commit(outs[0]), commit(outs[1]), commit(outs[2])
    first.wait()
    with pytest.raises(GpuError, match=r"command buffer 2 failed: fault injected by METALQWEN_CPU_FAULTS=cb:2 "
                                       r"after 2 of its 4 dispatches ran"):
        failing.wait()
    with pytest.raises(GpuError, match=r"command buffer 3 was not run: command buffer 2 before it failed"):
        behind.wait()  # committed before the failure was observed: ignored, as Metal does
    after = commit(outs[3])  # committed once a wait reported the failure: runs
    after.wait()
    assert [list(o.numpy(np.uint32)) for o in outs] == [[1, 2, 3, 4], [1, 2, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]]


def test_a_malformed_fault_setting_is_refused(monkeypatch):
    monkeypatch.setenv("METALQWEN_CPU_FAULTS", "cb:0")
    with pytest.raises(GpuError, match=r"METALQWEN_CPU_FAULTS='cb:0' is not cb:N"):
        gpu.Device("cpu")


# ---------------------------------------------------------------- the engine after a failed step


def test_a_failed_prefill_chunk_resets_the_sequence(demo, clean, monkeypatch):
    # Three layers per buffer: each chunk is two buffers. The first chunk (to the boundary) fails in
    # its second buffer, its snapshot with it; the second chunk, queued behind, is not run.
    model = load(demo, monkeypatch, fault=2, prefix_cache_bytes=1 << 24, prefill_layers_per_buffer=3)
    with pytest.raises(GpuError, match=r"\[engine\] prefill chunk failed on the GPU; slot 0 reset .*"
                                       r"command buffer 2 \('prefill chunk \(layer 3 and after\)'\) failed"):
        model.generate(PROMPT, max_tokens=4, boundaries=[4])
    assert_reset(model)
    assert len(model.prefix_cache) == 0  # the snapshots of a failed prefill are not kept
    counters = model.counters()
    assert counters["failed_steps"] == 1 and counters["command_buffers"] == 4
    assert model.generate(PROMPT, max_tokens=4).tokens == clean(PROMPT, 4)


def test_a_failed_step_of_a_pipelined_decode(demo, clean, monkeypatch):
    # Buffers 3, 4, 5: decode steps, each committed before the previous one is waited for; the
    # first fails and the second, committed behind it, is not run.
    model = load(demo, monkeypatch, fault=3)
    got = []
    with pytest.raises(GpuError, match=r"decode step failed on the GPU; slot 0 reset .*"
                                       r"command buffer 3 \('decode step'\) failed"):
        for chunk in model.stream(PROMPT, max_tokens=4):
            got.append(chunk.token)
    assert got == clean(PROMPT, 4)[:1]  # the token the prefill chose
    assert_reset(model)
    counters = model.counters()
    assert counters["max_steps_in_flight"] == 2 and counters["command_buffers"] == 4
    assert model.generate(PROMPT, max_tokens=4).tokens == clean(PROMPT, 4)


class AlwaysDraft:
    """Drafts k copies of the last token: every step is a verify step."""

    def draft(self, history, k):
        return [history[-1]] * k


def test_a_failed_verify_step(demo, clean, monkeypatch):
    model = load(demo, monkeypatch, fault=3, speculative="lookup")  # buffer 3: the first verify step
    with pytest.raises(GpuError, match=r"verify step failed on the GPU; slot 0 reset .*"
                                       r"command buffer 3 \('verify step'\) failed"):
        model.generate(PROMPT, max_tokens=4, speculative=AlwaysDraft())
    assert_reset(model)
    out = model.generate(PROMPT, max_tokens=4, speculative=AlwaysDraft())
    assert out.tokens == clean(PROMPT, 4) and out.stats.verify_steps > 0


@pytest.mark.parametrize("fault", [4, 5], ids=["with-a-prompt-chunk", "decoding"])
def test_a_failed_shared_step_ends_every_request_in_it(demo, clean, monkeypatch, fault):
    # Round 1: PROMPT's chunks (1-2), a step of its slot alone (3); round 2: OTHER's prompt as a
    # chunk of the shared step with PROMPT's row (4); round 3: the shared step of both (5, PROMPT's
    # fourth token).
    model = load(demo, monkeypatch, fault=fault, max_sequences=2)
    scheduler = Scheduler(model)
    seqs = [scheduler.submit(PROMPT, 4), scheduler.submit(OTHER, 4)]
    scheduler.run()
    for seq in seqs:
        assert isinstance(seq.error, GpuError) and "shared step failed on the GPU; slots 0, 1 reset" in str(seq.error)
        with pytest.raises(GpuError):
            seq.generation()
    assert_reset(model, 0)
    assert_reset(model, 1)
    again = model.generate_batch([PROMPT, OTHER], max_tokens=4)
    assert [g.tokens for g in again] == [clean(PROMPT, 4), clean(OTHER, 4)]


@pytest.mark.parametrize("sequences, kind", [(1, "decode step"), (2, "shared step")])  # alone, or the scheduler's
def test_the_server_answers_a_failed_request_with_500_and_serves_the_next(demo, clean, monkeypatch, sequences, kind):
    model = load(demo, monkeypatch, fault=4, max_sequences=sequences)  # the first request's third token
    live = LiveServer(create_app(model))
    try:
        body = {"model": "x", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        failed = httpx.post(live.url + "/v1/completions", json=body, timeout=120)
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["type"] == "server_error" and f"{kind} failed on the GPU" in error["message"]
        served = httpx.post(live.url + "/v1/completions", json=body, timeout=120)
        assert served.status_code == 200
        assert served.json()["choices"][0]["text"] == clean.generation(PROMPT, 4).text
    finally:
        live.close()


# ---------------------------------------------------------------- command buffers of bounded length


def test_a_prefill_chunk_takes_a_command_buffer_per_bounded_run_of_layers(demo, clean, monkeypatch):
    model = load(demo, monkeypatch, prefill_layers_per_buffer=1)  # the demo model has 4 layers
    logits = model.score(PROMPT)
    counters = model.counters()
    assert counters["steps"] == 2 and counters["command_buffers"] == 2 * 4  # two chunks of four buffers
    reference = clean.model.score(PROMPT)  # one buffer per chunk (8 layers per buffer by default)
    np.testing.assert_array_equal(logits, reference)
    # Decode steps stay one buffer each.
    engine = model._engine
    engine.decode_begin(0, 3)
    while engine.decode_next() is not None:
        pass
    engine.decode_end()
    assert model.counters()["command_buffers"] - counters["command_buffers"] == 2
