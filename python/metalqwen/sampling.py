"""The sampling settings of a generation, checked in one place for every front end: ``Model``
(``stream``/``generate``/``request``), the command line and the server's request bodies.

Each failure is a TypeError (wrong kind of value) or ValueError (out of range) naming the
field, the value and what is allowed (penalty ranges as OpenAI and vLLM take them). A field
left out comes from ``with_defaults``: the folder's generation_config.json, else the value
that turns it off; each front end picks its own temperature for when neither gives one.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from . import _core, arguments

__all__ = ["FIELDS", "MAX_LOGIT_BIAS", "MAX_TOP_LOGPROBS", "NEUTRAL", "check", "check_field", "check_logit_bias",
           "check_logprobs", "with_defaults"]

# The value that turns each sampling filter or penalty off; each front end adds its own temperature
# for when neither the user nor generation_config.json gives one.
NEUTRAL = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "repetition_penalty": 1.0}
FIELDS = ("temperature", *NEUTRAL)

MAX_TOP_LOGPROBS = _core.MAX_TOP_LOGPROBS  # top entries per token the logprobs kernel keeps
MAX_LOGIT_BIAS = _core.MAX_LOGIT_BIAS  # entries of a logit_bias (OpenAI's bound too)

# The range of each real-valued field: arguments.number's keywords.
_RANGES = {
    "temperature": dict(low=0, allowed=">= 0 (0 = greedy)"),
    "top_p": dict(low=0, high=1, low_open=True, allowed="in (0, 1] (1 = off)"),
    "min_p": dict(low=0, high=1, allowed="in [0, 1] (0 = off)"),
    "presence_penalty": dict(low=-2, high=2, allowed="in [-2, 2] (0 = off)"),
    "frequency_penalty": dict(low=-2, high=2, allowed="in [-2, 2] (0 = off)"),
    "repetition_penalty": dict(low=0, low_open=True, allowed="> 0 (1 = off)"),
}


def check_field(name: str, value: Any) -> float | int:
    """One sampling field (a name of FIELDS), checked on its own."""
    if name == "top_k":
        return arguments.integer("top_k", value, low=0, allowed=">= 0 (0 = off)")
    return arguments.number(name, value, **_RANGES[name])


def check_logprobs(value: Any, name: str = "logprobs") -> int:
    """None (off, the engine's -1) or how many top log-probabilities to report, 0..MAX_TOP_LOGPROBS."""
    if value is None:
        return -1
    allowed = f"an integer in 0..{MAX_TOP_LOGPROBS} (top entries per token), or None for off"
    value = arguments.integer(name, value, low=0, allowed=allowed)
    if value > MAX_TOP_LOGPROBS:
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_logit_bias(value: Any, vocab_size: int) -> list[tuple[int, float]]:
    """OpenAI's logit_bias: a mapping of token ids (ints, or their decimal strings as JSON
    keys are) to a bias in [-100, 100], at most MAX_LOGIT_BIAS of them; None or {} for none.
    Returns the engine's (id, bias) pairs."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise TypeError(f"logit_bias must be a mapping of token ids to biases, got {type(value).__name__}")
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got {len(value)}")
    pairs = {}
    for key, bias in value.items():
        token = key
        if isinstance(key, str):
            try:
                token = int(key)
            except ValueError:
                raise TypeError(f"logit_bias keys must be token ids (integers, or their decimal strings), "
                                f"got {key!r}") from None
        token = arguments.integer("logit_bias token id", token, low=0, allowed=f"in 0..{vocab_size - 1}")
        if token >= vocab_size:
            raise ValueError(f"logit_bias token id {token} is outside the vocabulary (0..{vocab_size - 1})")
        if token in pairs:
            raise ValueError(f"logit_bias names token id {token} twice")
        pairs[token] = arguments.number(f"logit_bias[{key!r}]", bias, low=-100, high=100, allowed="in [-100, 100]")
    return list(pairs.items())


def check(temperature: Any = 0.0, top_p: Any = 1.0, top_k: Any = 0, seed: Any = None, min_p: Any = 0.0,
          presence_penalty: Any = 0.0, frequency_penalty: Any = 0.0, repetition_penalty: Any = 1.0,
          logprobs: Any = None) -> dict:
    """The engine's sampling keywords, each field checked: the FIELDS, ``seed`` (None: a random
    one, else taken modulo 2**64) and ``logprobs`` (-1 when off)."""
    given = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, presence_penalty=presence_penalty,
                 frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty)
    checked = {name: check_field(name, given[name]) for name in FIELDS}
    if seed is None:
        checked["seed"] = int.from_bytes(os.urandom(8), "little")
    else:
        checked["seed"] = arguments.integer("seed", seed, low=0,
                                            allowed="an integer >= 0, or None for a random seed") % 2**64
    checked["logprobs"] = check_logprobs(logprobs)
    return checked


def with_defaults(given: Mapping[str, Any], folder: Mapping[str, Any], temperature: float) -> dict:
    """Every sampling field: from ``given`` unless missing or None, else from ``folder`` (the
    folder's generation_config.json, ``ModelConfig.sampling_defaults``), else neutral, with
    ``temperature`` as the front end's own fallback temperature."""
    fallback = {"temperature": temperature, **NEUTRAL, **folder}
    return {name: given[name] if given.get(name) is not None else fallback[name] for name in FIELDS}
