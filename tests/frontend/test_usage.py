"""What a new user of the Python API runs into: the context limit, bad arguments, Ctrl-C.
Each failure must be a metalqwen exception or a TypeError/ValueError naming the argument."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

import metalqwen
from metalqwen import ContextFullError, EngineError, MetalqwenError


@pytest.fixture(scope="module")
def small(demo, device):
    """The demo model with room for 80 tokens."""
    return metalqwen.load(demo, device=device, max_context=80, progress=False)


@pytest.fixture(scope="module")
def roomy(demo, device):
    return metalqwen.load(demo, device=device, max_context=512, prefill_chunk=16, progress=False)


# ---------------------------------------------------------------------------- the context limit


def test_generation_that_reaches_max_context_returns_what_it_made(small, roomy):
    prompt = "word " * 20
    ids = small.prompt_ids(prompt)
    out = small.generate(prompt, max_tokens=100)
    assert out.finish_reason == "length" and out.stats.context_full
    assert len(out.tokens) == small.max_context - len(ids) and out.text
    # Nothing lost: the same tokens as with room to spare (greedy).
    assert out.tokens == roomy.generate(prompt, max_tokens=len(out.tokens)).tokens
    # max_tokens reached first is not a full context.
    short = small.generate(prompt, max_tokens=3)
    assert short.finish_reason == "length" and not short.stats.context_full


def test_a_prompt_that_does_not_fit_is_refused_before_running(small):
    small.generate([1, 2], max_tokens=1)
    steps = small.counters()["steps"]
    with pytest.raises(ContextFullError, match="80 tokens \\+ 1 for the next token exceed max_context 80"):
        small.generate(list(range(80)), max_tokens=1)
    with pytest.raises(ValueError, match="exceed max_context 80"):  # also a ValueError
        small.score(list(range(85)))
    assert small.counters()["steps"] == steps
    assert small.generate([1, 2], max_tokens=2).tokens  # still usable


def test_engine_errors_are_metalqwen_exceptions(small):
    engine = small._engine
    engine.reset(0)
    with pytest.raises(ContextFullError, match=r"\[engine\] context full"):
        engine.prefill(0, list(range(80)))
    with pytest.raises(EngineError, match="decode_next without decode_begin"):
        engine.decode_next()
    with pytest.raises(EngineError, match="outside the vocabulary"):
        engine.prefill(0, [10**6])
    assert issubclass(EngineError, MetalqwenError) and issubclass(metalqwen.GpuError, MetalqwenError)
    assert issubclass(metalqwen.CheckpointError, MetalqwenError)


# ---------------------------------------------------------------------------- bad arguments

BAD_CALLS = [
    ("generate", (42,), {}, TypeError, "prompt must be text .* got int 42"),
    ("generate", ({"role": "user"},), {}, TypeError, "prompt must be text .* got dict .*a list of messages"),
    ("generate", ([{"role": "user", "content": "hi"}, 3],), {}, TypeError, "prompt must be text"),
    ("generate", ([1, "2"],), {}, TypeError, "prompt must hold integer token ids; item 1 is str '2'"),
    ("generate", ([1.5],), {}, TypeError, "item 0 is float 1.5"),
    ("generate", ([],), {}, ValueError, "prompt is empty"),
    ("generate", ("",), {}, ValueError, "prompt is empty"),
    ("generate", ("   ",), {"chat": True}, ValueError, "chat message needs some text"),
    ("generate", ([1, 10**6],), {}, ValueError, "prompt has token ids outside the vocabulary"),
    ("generate", ("hi",), {"temperature": "hot"}, TypeError, "temperature must be a number .* got str 'hot'"),
    ("generate", ("hi",), {"temperature": -1}, ValueError, "temperature must be >= 0 .* got -1"),
    ("generate", ("hi",), {"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\] .* got 1.5"),
    ("generate", ("hi",), {"top_p": 0}, ValueError, "top_p must be in"),
    ("generate", ("hi",), {"top_k": -1}, ValueError, "top_k must be >= 0 .* got -1"),
    ("generate", ("hi",), {"top_k": 2.5}, TypeError, "top_k must be an integer"),
    ("generate", ("hi",), {"seed": "x"}, TypeError, "seed must be an integer"),
    ("generate", ("hi",), {"max_tokens": 0}, ValueError, "max_tokens must be an integer >= 1, got 0"),
    ("generate", ("hi",), {"max_tokens": "5"}, TypeError, "max_tokens must be an integer"),
    ("generate", ("hi",), {"stop": 5}, TypeError, "stop must be a string or a list"),
    ("stream", (42,), {}, TypeError, "prompt must be text"),  # at the call, not at the first next()
    ("score", ("hello",), {}, TypeError, "token_ids must be token ids .* got text; encode it"),
    ("score", (np.array([1.0, 2.0]),), {}, TypeError, "1-D array of integer token ids"),
    ("score", ([],), {}, ValueError, "token_ids is empty"),
]


@pytest.mark.parametrize("method, args, kwargs, error, message", BAD_CALLS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_arguments_name_the_argument(small, method, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        getattr(small, method)(*args, **kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(kv_bits=4), ValueError, "kv_bits must be 8 or 16, got 4"),
    (dict(max_context=1), ValueError, "max_context must be an integer >= 2, got 1"),
    (dict(max_context="big"), TypeError, "max_context must be an integer"),
    (dict(prefill_chunk=0), ValueError, "prefill_chunk must be an integer >= 1"),
    (dict(device=3), TypeError, "device must be 'metal', 'cpu'"),
])
def test_bad_load_arguments(demo, kwargs, error, message):
    with pytest.raises(error, match=message):
        metalqwen.load(demo, progress=False, **kwargs)


def test_a_file_given_as_the_model_folder_says_so(demo):
    with pytest.raises(metalqwen.CheckpointError, match="is a file; give the checkpoint folder"):
        metalqwen.load(os.path.join(demo, "config.json"))
    with pytest.raises(metalqwen.CheckpointError, match="does not exist"):
        metalqwen.load(os.path.join(demo, "nowhere"))


# ---------------------------------------------------------------------------- Ctrl-C


def _sigint_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_stops_a_prefill_between_chunks_and_the_cache_stays_usable(roomy, demo, device, ctrl_c):
    ids = [int(t) for t in np.random.default_rng(3).integers(0, roomy.config.vocab_size, 400)]
    roomy.reset()
    timer = _sigint_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        roomy.generate(ids, max_tokens=2)
    timer.join()
    fed = roomy._engine.position(0)
    assert 0 < fed < len(ids) and fed % 16 == 0, "stopped at a chunk boundary, before the end"
    assert roomy._engine.tokens(0) == ids[:fed]
    # The next call reuses the fed chunks and continues exactly as a cold run.
    out = roomy.generate(ids[: fed + 20], max_tokens=4)
    assert out.stats.prompt_tokens_reused == fed
    cold = metalqwen.load(demo, device=device, max_context=512, prefill_chunk=16, progress=False)
    assert out.tokens == cold.generate(ids[: fed + 20], max_tokens=4).tokens


def test_ctrl_c_stops_decoding_within_a_step_and_keeps_what_was_made(roomy, demo, device, ctrl_c):
    roomy.reset()
    # This prompt decodes hundreds of tokens before an eos on the demo checkpoint.
    ids = roomy.prompt_ids("a", chat=True)
    made, timer = [], None
    with pytest.raises(KeyboardInterrupt):
        for chunk in roomy.stream(ids, max_tokens=roomy.max_context - len(ids)):
            made.append(chunk.token)
            if len(made) == 3:  # from another thread, while decoding goes on
                timer = _sigint_after(0.05)
    timer.join()
    tokens = roomy.last_tokens
    assert made and tokens[: len(made)] == made and len(tokens) < roomy.max_context - len(ids)
    cached = roomy._engine.tokens(0)
    assert cached == (ids + tokens)[: len(cached)] and len(cached) >= len(ids) + len(tokens) - 1
    follow = ids + tokens + [5, 6]
    out = roomy.generate(follow, max_tokens=3)
    assert out.stats.prompt_tokens_reused == len(cached)
    cold = metalqwen.load(demo, device=device, max_context=512, prefill_chunk=16, progress=False)
    assert out.tokens == cold.generate(follow, max_tokens=3).tokens
