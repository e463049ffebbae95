"""A Qwen3.5 checkpoint loaded on a device (``loading.load`` makes one): generating text from it."""

from __future__ import annotations

import os
import time
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import arguments, gpu, images as image_prompts, speculative as spec
from .batching import Scheduler
from .checkpoint import Checkpoint, CheckpointError
from .config import ModelConfig
from .errors import ContextFullError
from .generation import (Chunk, Generation, GenerationStats, Output, Prompt, Request, Runner,
                         count_speculation)
from .mtp_checkpoint import how_to_get_mtp
from .prefix_cache import PrefixCache
from .sampling import check as check_sampling, check_logit_bias
from .tokenizer import Tokenizer

__all__ = ["Model", "Generation", "GenerationStats", "Chunk"]


class Model:
    """A checkpoint on a device. Not thread-safe: one generation at a time."""

    def __init__(self, checkpoint: Checkpoint, tokenizer: Tokenizer, device: gpu.Device, engine, progress: bool,
                 prefix_cache: PrefixCache | None = None, speculative: str = "off", draft_depth: int = 0,
                 vision=None, no_vision: str = ""):
        self.checkpoint = checkpoint
        # The vision tower (vision.VisionTower) when the folder has one, else None and why not.
        self.vision = vision
        self.no_vision = no_vision
        self.config: ModelConfig = checkpoint.config
        self.tokenizer = tokenizer
        self.device = device
        self._engine = engine
        # The engine's side of generation, which a batching.Scheduler drives too.
        self.runner = Runner(engine, prefix_cache, progress)
        self.eos_token_ids = sorted(set(self.config.eos_token_ids) | {tokenizer.eos_token_id} - {None})
        self.speculative = speculative  # "mtp" | "lookup" | "dflash" | "off": what stream() does unless told otherwise
        self.draft_depth = draft_depth  # drafts per verify step at most (the engine's rollback planes)
        # Statistics of the latest generate/stream (complete once the stream is exhausted).
        self.last_stats: GenerationStats | None = None
        # Every token the latest generate/stream produced, eos included (also when interrupted).
        self.last_tokens: list[int] = []
        self.last_finish_reason = "stop"  # of the latest generate/stream: "stop" | "length"
        self._grammars = None  # constraints.Grammars, made by the first constrained request

    @property
    def max_context(self) -> int:
        return self._engine.max_context

    @property
    def progress(self) -> bool:
        """Whether prefills show their progress on stderr."""
        return self.runner.progress

    @progress.setter
    def progress(self, show: bool) -> None:
        self.runner.progress = show

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The snapshots prompts resume from (``load(prefix_cache_bytes=...)``), or None."""
        return self.runner.prefix_cache

    def counters(self) -> dict:
        """Engine counters: steps (prefill chunks, decode, verify and shared steps) and their command buffers
        (a prefill chunk takes one per ``prefill_layers_per_buffer`` layers), steps the GPU failed, dispatches
        and barriers (dependent dispatch boundaries), host encode µs, CPU waits, decoded tokens, weight bytes
        per token, weight bytes placed (``weight_bytes``: a pipeline rank's own; the vision tower's too),
        memory estimate (the tower's weights in it), the load's weight buffers, bytes read into arenas and
        resident-set peak (``load_peak_rss``, from ``load_rss_before``), the compiled library's kernels and
        source bytes; ``*_last_step`` for the latest step; ``vision_tower_runs`` (images the vision tower
        ran over) and ``vision_features_reused`` (images whose features came from its cache, 0 without
        a tower)."""
        counters = self.runner.counters()
        counters.update(vision_tower_runs=self.vision.runs if self.vision else 0,
                        vision_features_reused=self.vision.reused if self.vision else 0)
        return counters

    def reset(self) -> None:
        """Forgets the cached conversation."""
        self._engine.reset(0)

    @property
    def mtp_bytes(self) -> int:
        """Bytes of the MTP head's weights in the checkpoint (0 when it was not loaded)."""
        return sum(t.nbytes for t in self.checkpoint.mtp.values()) if self._engine.has_mtp else 0

    @property
    def _mtp_loaded(self) -> bool:
        """Whether the MTP head was loaded (anywhere: a pipeline's last rank holds it)."""
        return self._engine.has_mtp

    def mtp_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """The MTP head's logits (float32 [len(token_ids) - 1, vocab]) from a fresh state: row t
        predicts token_ids[t + 2] from the trunk's hidden state at t and token_ids[t + 1], with the
        head's cache holding rows 0..t. Resets the cached conversation."""
        if not self._engine.has_mtp:
            if self.checkpoint.mtp:
                raise ValueError("the model was loaded with mtp=False: load it with mtp=True for mtp_logits")
            raise CheckpointError(f"[checkpoint] {how_to_get_mtp(self.checkpoint.path)}")
        ids = arguments.token_ids("token_ids", token_ids, self.config.vocab_size)
        if len(ids) < 2:
            raise ValueError(f"mtp_logits needs at least 2 token ids, got {len(ids)}")
        if len(ids) > self.max_context:
            raise ContextFullError(f"{len(ids)} token ids exceed max_context {self.max_context}")
        return self._engine.mtp_logits(0, ids)

    def score(self, token_ids: Prompt, images: Sequence = (), chat: bool = False,
              enable_thinking: bool | None = None) -> np.ndarray:
        """Logits (float32 [tokens, vocab]) at every position, from a fresh state. ``token_ids``: ids or
        chat messages; with ``images``, any prompt ``stream`` takes, and the tokens are the prompt's
        with each image's pad repeated once per feature row (``prompt_ids(..., images=)`` gives them)."""
        messages = not isinstance(token_ids, str) and arguments.prompt_kind(token_ids) == "messages"
        if images or messages:
            ids, prepared = self._prompt(token_ids, chat, enable_thinking, images)
        else:
            ids, prepared = arguments.token_ids("token_ids", token_ids, self.config.vocab_size), None
            self._check_no_image_places(ids)
        self._check_fits(ids)
        self._engine.reset(0)
        if prepared is None:
            return self._engine.prefill(0, ids, logits="all")
        return self._engine.prefill(0, ids, logits="all", **prepared.engine_args())

    def prompt_ids(self, prompt: Prompt, chat: bool = False, enable_thinking: bool | None = None,
                   images: Sequence = ()) -> list[int]:
        """Token ids of a prompt: a list of ids is used as is; text is encoded (with the chat template if chat,
        ``enable_thinking`` passed to it: None leaves the template's default, thinking on for Qwen3.5); a
        list of chat messages (OpenAI content parts allowed) is rendered with the template. With images
        (``images`` or image parts), each image's pad token is repeated once per feature row (this runs
        the vision tower)."""
        return self._prompt(prompt, chat, enable_thinking, images)[0]

    def _prompt(self, prompt, chat: bool, enable_thinking: bool | None, images: Sequence = ()):
        """(token ids, images.PreparedImages or None) of a prompt (see prompt_ids)."""
        if images is None or isinstance(images, (str, bytes, os.PathLike)) or not isinstance(images, Sequence):
            raise TypeError(f"images must be a list of images (paths, bytes, PIL images or uint8 arrays), "
                            f"got {type(images).__name__}")
        images = list(images)
        kind = arguments.prompt_kind(prompt)
        if kind == "ids":
            ids = arguments.token_ids("prompt", prompt, self.config.vocab_size)
        elif kind == "messages":
            messages, images = image_prompts.flatten_messages(prompt, images)
            ids = self.tokenizer.encode_chat(messages, enable_thinking=enable_thinking)
        elif chat or images:
            if not prompt.strip():
                raise ValueError("prompt is empty (a chat message needs some text)")
            text = image_prompts.IMAGE_TEXT * len(images) + prompt  # mlx-vlm's order: images, then text
            ids = (self.tokenizer.encode_chat([{"role": "user", "content": text}], enable_thinking=enable_thinking)
                   if chat else self.tokenizer.encode(text))
        else:
            ids = self.tokenizer.encode(prompt)
        if not images:
            self._check_no_image_places(ids)
            return ids, None
        tower, tokens = self._vision()
        prepared = image_prompts.prepare(ids, images, tower, tokens)
        return prepared.ids, prepared

    def _vision(self):
        """(tower, vision token ids), or the error saying why this model takes no images."""
        if self.vision is None:
            raise ValueError(f"this model takes no images: {self.no_vision}")
        tokens = image_prompts.ImageTokens.from_config(self.config.raw, self.config.source)
        for text, want in (("<|vision_start|>", tokens.start), ("<|image_pad|>", tokens.pad),
                           ("<|vision_end|>", tokens.end)):
            if self.tokenizer.encode(text) != [want]:
                raise ValueError(f"[images] the tokenizer does not encode {text} as the config's token {want}")
        return self.vision, tokens

    def _check_no_image_places(self, ids: list[int]) -> None:
        """ValueError when text-only ids hold an image place (its features would be missing)."""
        pad = self.config.raw.get("image_token_id")
        if self.vision is not None and pad in ids:
            raise ValueError("the prompt has image places (<|image_pad|>) but no images were given")

    def generate(self, prompt: Prompt, max_tokens: int = 256, **options) -> Generation:
        """Generates up to ``max_tokens`` tokens. Options as for ``stream``."""
        text = "".join(chunk.text for chunk in self.stream(prompt, max_tokens=max_tokens, **options))
        return Generation(tokens=list(self.last_tokens), text=text, finish_reason=self.last_finish_reason,
                          stats=self.last_stats)

    def generate_batch(self, prompts: Sequence[Prompt], max_tokens: int = 256, **options) -> list[Generation]:
        """Generates for several prompts together (options as for ``stream``, the same for each):
        up to ``max_sequences`` of them (``load``) share each step; the others wait for a slot.
        Each result equals what ``generate`` gives for that prompt alone."""
        scheduler = self.scheduler()
        requests = [scheduler.submit(p, max_tokens, **options) for p in prompts]
        scheduler.run()
        return [r.generation() for r in requests]

    def scheduler(self) -> Scheduler:
        """A batching.Scheduler of this model's slots (the server's Worker runs one)."""
        return Scheduler(self)

    @property
    def max_sequences(self) -> int:
        """Sequence slots reserved at load (``load(max_sequences=...)``)."""
        return self._engine.max_sequences

    def stream(self, prompt: Prompt, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, stop: Sequence[str] | None = None,
               chat: bool = False, boundaries: Sequence[int] = (), min_p: float = 0.0,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
               repetition_penalty: float = 1.0, logprobs: int | None = None,
               speculative: str | spec.Drafter | None = None, enable_thinking: bool | None = None,
               json_schema: Mapping[str, Any] | str | None = None, grammar: str | None = None,
               response_format: Mapping[str, Any] | None = None,
               logit_bias: Mapping[int | str, float] | None = None, images: Sequence = ()) -> Iterator[Chunk]:
        """Yields text as tokens are generated. ``prompt``: text (chat template applied when ``chat``,
        with ``enable_thinking`` when given: False asks Qwen3.5 to answer without thinking), ids, or
        chat messages (role/content dicts; content may be OpenAI parts: text, image_url with a data:
        URL or a local path, image).

        ``images`` (paths, bytes, PIL images or uint8 arrays; folders with a vision tower only,
        docs/images.md): with a text prompt they go first, then the text, in one user message when
        ``chat`` (mlx-vlm's order); with messages they fill the ``{"type": "image"}`` parts that
        carry none, the rest going first in the last user message; with ids each
        ``<|vision_start|><|image_pad|><|vision_end|>`` takes the next image. A prompt with images
        resumes from the prefix cache by its pictures' content (never the live state; ``boundaries``
        count one pad per image).

        Greedy when temperature is 0; else sampling with top-k (0 = off), top-p (1 = off) and
        min-p (0 = off), in that order after the temperature, reproducible for a given seed.
        Before either, on the GPU: ``repetition_penalty`` (1 = off) divides the positive logits
        (multiplies the negative ones) of every token in the prompt or generated so far, then
        ``frequency_penalty`` times a token's count and ``presence_penalty`` (0 = off) are
        subtracted for the tokens generated so far in this call (vLLM's definitions). ``logprobs``
        (0..20; None = off) fills each chunk's ``logprob`` and its ``top_logprobs`` (that many
        entries), computed on the GPU from the raw logits. Stops at an eos token, a ``stop`` string (not included in
        the text), ``max_tokens`` or the end of the context (``finish_reason`` "length",
        ``stats.context_full``); a prompt that leaves no room raises ContextFullError. The cache
        is kept: a next prompt that extends this conversation only feeds the new tokens. With a
        prefix cache (``load(prefix_cache_bytes=...)``) the state is also saved at the end of the
        prompt and at ``boundaries`` (prompt positions, e.g. message ends), and a prompt resumes
        from the longest saved prefix it starts with. Ctrl-C (KeyboardInterrupt) stops within
        one step and leaves the cache holding what was fed.

        ``speculative`` overrides the load's mode for this call: "mtp", "lookup", "off", or any object
        with ``draft(history, k) -> ids`` (a ``speculative.Drafter``). Speculation never changes
        the output (greedy: the same tokens; sampling: the same distribution); penalties and
        logprobs turn it off for the call (penalties would change with every draft; verify rows
        report no logprobs).

        Structured output (at most one of them): ``json_schema`` (a JSON schema, dict or text: the
        answer is one JSON value valid against it), ``grammar`` (Lark text, or GBNF when its rules
        are written ``name ::= ...``) or ``response_format`` (OpenAI's: {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"schema": {...}}} or {"type": "text"}). The
        grammar's mask of allowed tokens is computed on the CPU (llguidance) while the GPU runs
        each step, and applied on the GPU before the penalties and the choice; an eos token is
        allowed once the answer is complete and is then the only one. When the prompt ends inside
        ``<think>`` (a chat prompt with thinking on), free reasoning and ``</think>`` come first
        and the constraint applies to the answer after them. Under a grammar each token is a
        host decision: steps are not pipelined and speculation pauses (no drafts). Output cut by
        ``max_tokens`` may be incomplete (finish_reason "length"). Bad schemas or grammars raise
        ConstraintError naming the field. ``logit_bias`` ({token id: bias in [-100, 100]}, at most
        300, OpenAI's) is added to those tokens' logits on the GPU before the penalties (and
        turns speculation off); logprobs stay those of the model (masked tokens at -inf, bias
        not included), as vLLM reports them."""
        request = self.request(prompt, max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                               stop=stop, chat=chat, boundaries=boundaries, min_p=min_p,
                               presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                               repetition_penalty=repetition_penalty, logprobs=logprobs, speculative=speculative,
                               enable_thinking=enable_thinking, json_schema=json_schema, grammar=grammar,
                               response_format=response_format, logit_bias=logit_bias, images=images)
        return self._run(request)

    def request(self, prompt: Prompt, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                top_k: int = 0, seed: int | None = None, stop: Sequence[str] | None = None, chat: bool = False,
                boundaries: Sequence[int] = (), min_p: float = 0.0, presence_penalty: float = 0.0,
                frequency_penalty: float = 0.0, repetition_penalty: float = 1.0, logprobs: int | None = None,
                speculative: str | spec.Drafter | None = None, enable_thinking: bool | None = None,
                json_schema: Mapping[str, Any] | str | None = None, grammar: str | None = None,
                response_format: Mapping[str, Any] | None = None,
                logit_bias: Mapping[int | str, float] | None = None, images: Sequence = ()) -> Request:
        """Checks a generation's arguments (those of ``stream``); raises what ``stream`` would."""
        max_tokens = arguments.integer("max_tokens", max_tokens, low=1, allowed="an integer >= 1")
        sampling = check_sampling(temperature, top_p, top_k, seed, min_p, presence_penalty, frequency_penalty,
                                  repetition_penalty, logprobs)
        sampling["logit_bias"] = check_logit_bias(logit_bias, self.config.vocab_size)
        stop = arguments.stop_strings(stop)
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise TypeError(f"enable_thinking must be True, False or None, got {enable_thinking!r}")
        ids, prepared = self._prompt(prompt, chat, enable_thinking, images)
        self._check_fits(ids)
        constraint = self._constraint(ids, json_schema, grammar, response_format)
        sampling["token_mask"] = constraint is not None
        drafter = self._drafter(speculative, sampling)
        if prepared is not None:  # positions in the prompt as given, one pad per image
            boundaries = [prepared.expanded_position(int(b)) for b in boundaries]
        return Request(ids, max_tokens, sampling, stop, boundaries, drafter, constraint, prepared)

    @property
    def grammars(self):
        """The ``constraints.Grammars`` of this model's tokenizer and vocabulary (made on first use)."""
        if self._grammars is None:
            from .constraints import Grammars

            self._grammars = Grammars(self.tokenizer, self.config.vocab_size, self.eos_token_ids)
        return self._grammars

    def _constraint(self, ids: list[int], json_schema, grammar, response_format):
        """The request's grammar state (None when unconstrained), applying to the answer after the
        reasoning when the prompt ends inside <think>."""
        given = [name for name, value in (("json_schema", json_schema), ("grammar", grammar),
                                          ("response_format", response_format)) if value is not None]
        if not given:
            return None
        from .constraints import ConstraintError

        if len(given) > 1:
            raise ConstraintError(f"[constraints] give at most one of json_schema, grammar and response_format, "
                                  f"got {' and '.join(given)}")
        text = self.tokenizer.decode(ids)
        thinking = text.rfind("<think>") > text.rfind("</think>")
        if json_schema is not None:
            return self.grammars.json_schema(json_schema, thinking=thinking)
        if grammar is not None:
            return self.grammars.grammar(grammar, thinking=thinking)
        if not isinstance(response_format, Mapping):
            raise ConstraintError(f"[constraints] response_format must be a mapping such as {{'type': 'json_object'}}, "
                                  f"got {type(response_format).__name__}")
        return self.grammars.response_format(response_format, thinking=thinking)

    def _drafter(self, speculative, sampling: dict) -> spec.Drafter | None:
        """Who drafts for this call (None: plain decoding)."""
        mode = self.speculative if speculative is None else speculative
        if isinstance(mode, str):
            if mode not in ("mtp", "lookup", "dflash", "off"):
                raise ValueError(f"speculative must be 'mtp', 'lookup', 'dflash', 'off' or a Drafter for a call, "
                                 f"got {mode!r}")
            if mode == "off":
                return None
            if mode == "mtp" and not self._mtp_loaded:
                raise ValueError("speculative='mtp' needs the MTP head: load with speculative='mtp' or 'auto' "
                                 "(or mtp=True)")
            if mode == "dflash" and not self._engine.has_dflash:
                raise ValueError("speculative='dflash' needs a DFlash drafter: load with draft=PATH")
            mode = {"mtp": spec.MtpHead, "dflash": spec.DflashBlock}.get(mode, spec.PromptLookup)()
        elif not callable(getattr(mode, "draft", None)):
            raise TypeError(f"speculative must be 'mtp', 'lookup', 'off' or an object with draft(history, k), "
                            f"got {type(mode).__name__}")
        if self.draft_depth == 0:
            raise ValueError("speculative decoding needs the rollback state reserved at load: "
                             "load(..., speculative='lookup' or 'auto')")
        penalised = (sampling["presence_penalty"], sampling["frequency_penalty"], sampling["repetition_penalty"])
        constrained = sampling["logit_bias"] or sampling["token_mask"]  # chosen one row at a time
        return None if penalised != (0.0, 0.0, 1.0) or sampling["logprobs"] >= 0 or constrained else mode

    def _run(self, request: Request) -> Iterator[Chunk]:
        """The generator behind ``stream`` (arguments already checked, so errors come at the call)."""
        ids, sampling = request.ids, request.sampling
        out = Output(request, self.tokenizer, self.eos_token_ids)
        stats = self.last_stats = out.stats
        self.last_tokens = out.tokens
        self.last_finish_reason = "length"
        # Prefill chose one token and each decode step feeds one: room for max_context - len(ids).
        room = self.max_context - len(ids)
        budget = min(request.max_tokens, room)

        start = time.perf_counter()
        stats.prompt_tokens_reused = self.runner.feed_prompt(ids, sampling, request.boundaries, request.constraint,
                                                             request.images)
        stats.prompt_seconds = time.perf_counter() - start

        start = time.perf_counter()
        before = self.counters()
        if request.constraint is not None:
            tokens = self.runner.constrained_tokens(budget, sampling, request.constraint)
        elif request.drafter is None:
            tokens = self.runner.plain_tokens(budget, sampling)
        else:
            tokens = self.runner.speculative_tokens(ids, budget, sampling, request.drafter, self.draft_depth)
        try:
            for token in tokens:
                chunk = out.add(token, self.runner.last_logprobs(0))
                if chunk is not None:
                    yield chunk
                if out.done:
                    break
        finally:
            tokens.close()
            self.last_finish_reason = out.finish_reason
            # An interrupt that lands while decode_next runs loses the token it returned, but
            # that token was fed: take it from the cache so last_tokens matches the cache.
            fed = self._engine.tokens(0)[len(ids):]
            if len(fed) > len(out.tokens):
                self.last_tokens = out.tokens = fed
                stats.generated_tokens = len(fed)
            stats.decode_seconds = time.perf_counter() - start
            out.settle(room, request.max_tokens, self.counters())
            count_speculation(stats, before, stats.engine)
        tail = out.tail()
        if tail is not None:
            yield tail

    def _check_fits(self, ids: list[int]) -> None:
        """ContextFullError unless ``ids`` and the token chosen after them fit in max_context."""
        if len(ids) + 1 > self.max_context:
            raise ContextFullError(f"the prompt does not fit: {len(ids)} tokens + 1 for the next token exceed "
                                   f"max_context {self.max_context} (load with a larger max_context, or shorten "
                                   "the prompt)")
