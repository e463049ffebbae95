"""Tokenizer, chat template and streaming text for a checkpoint folder (no transformers needed).

``Tokenizer.from_folder(path)`` reads tokenizer.json with the ``tokenizers`` package and
the chat template (chat_template.jinja, else tokenizer_config.json's ``chat_template``),
which ``apply_chat_template`` renders with jinja2 the way transformers does (same
environment options, message clean-up and variables), so prompts are byte-identical.

``StreamDecoder`` turns generated ids into text pieces that are always complete UTF-8
(byte-level BPE splits emoji/CJK characters across tokens). ``StopMatcher`` /
``find_stop`` handle stop strings: where the first one starts, and how much text is
safe to emit while one might still be forming.
"""

from __future__ import annotations

import functools
import json
import os
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from .config import CheckpointError

__all__ = ["StopMatcher", "StreamDecoder", "Tokenizer", "TokenizerError", "find_stop"]


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table): the printable Latin-1
    bytes stand for themselves, the others take the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


_BYTE_OF_CHAR = _byte_level_alphabet()


class TokenizerError(CheckpointError):
    """Missing or unusable tokenizer files, or a chat template that cannot render."""


_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _token_content(value) -> str | None:
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A checkpoint's tokenizer: ``encode``/``decode`` plus the chat template."""

    def __init__(self, tokenizer, *, config: Mapping[str, Any] | None = None, chat_template: str | None = None,
                 source: str = ""):
        self._tok = tokenizer
        self.config = dict(config or {})
        self.chat_template = chat_template
        self.source = source
        self.special_tokens_map = {k: v for k in _SPECIAL_KEYS if (v := _token_content(self.config.get(k)))}
        self._template = None

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "Tokenizer":
        """Loads tokenizer.json (required), tokenizer_config.json and chat_template.jinja (optional)."""
        from tokenizers import Tokenizer as _HFTokenizer

        folder = os.fspath(path)
        if not os.path.isdir(folder):
            raise TokenizerError(f"[tokenizer] checkpoint folder {folder} does not exist")
        tok_path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(tok_path):
            raise TokenizerError(f"[tokenizer] {tok_path} is missing (metalqwen needs the fast-tokenizer file "
                                 f"tokenizer.json)")
        try:
            tok = _HFTokenizer.from_file(tok_path)
        except Exception as e:  # the tokenizers package raises plain Exceptions
            raise TokenizerError(f"[tokenizer] {tok_path} cannot be loaded: {e}") from None

        config: dict = {}
        cfg_path = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(cfg_path):
            config = _read_json(cfg_path)
        template = None
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            try:
                with open(jinja_path, encoding="utf-8") as f:
                    template = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise TokenizerError(f"[tokenizer] cannot read {jinja_path}: {e}") from None
        else:
            template = config.get("chat_template")
            if isinstance(template, list):  # named templates: [{"name", "template"}, ...]
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
                template = named.get("default")
            if template is not None and not isinstance(template, str):
                raise TokenizerError(f"[tokenizer] {cfg_path}: chat_template must be a string")
        return cls(tok, config=config, chat_template=template, source=folder)

    # ------------------------------------------------------------------ ids <-> text

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for: with a byte-level BPE (Qwen's) a token may hold
        part of a UTF-8 character, which ``decode`` would show as U+FFFD; added tokens are their text."""
        from tokenizers.decoders import ByteLevel

        piece = self.id_to_token(token_id)
        added = token_id in self._added_ids
        if piece is None or added or not isinstance(self._tok.decoder, ByteLevel):
            return self.decode([token_id]).encode("utf-8")
        try:
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        except KeyError:  # not byte-level text after all
            return self.decode([token_id]).encode("utf-8")

    @functools.cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self._tok.get_added_tokens_decoder())

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.token_to_id(self.eos_token)

    def stream_decoder(self, skip_special_tokens: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ chat

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs,
    ) -> str:
        """Renders ``messages`` with the checkpoint's own chat template, as transformers does.

        ``enable_thinking=None`` leaves the variable undefined (the template's default);
        extra keyword arguments become template variables too.
        """
        if self.chat_template is None:
            raise TokenizerError(f"[tokenizer] {self.source}: no chat template (neither chat_template.jinja nor "
                                 f"tokenizer_config.json's chat_template)")
        if self._template is None:
            self._template = _compile_template(self.chat_template, self.source)
        variables = dict(self.special_tokens_map)
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        variables.update(kwargs)
        try:
            return self._template.render(
                messages=_clean_messages(messages),
                tools=None if tools is None else [dict(t) for t in tools],
                documents=None if documents is None else [dict(d) for d in documents],
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except Exception as e:  # jinja2 TemplateError, or the template's own raise_exception
            raise TokenizerError(f"[tokenizer] {self.source}: chat template failed: {e}") from None

    def encode_chat(self, messages, add_generation_prompt: bool = True, enable_thinking: bool | None = None,
                    **kwargs) -> list[int]:
        """Token ids of the rendered chat (special tokens in the text are matched, none added)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, enable_thinking, **kwargs))


def _read_json(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"[tokenizer] {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"[tokenizer] {path}: expected a JSON object")
    return data


def _clean_messages(messages) -> list[dict]:
    """transformers' message clean-up: keys whose value is None dropped, reasoning aliased."""
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            raise TokenizerError(f"[tokenizer] chat messages must be dicts, got {m!r}")
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def _compile_template(source: str, where: str):
    """A jinja2 template in the environment transformers uses for chat templates."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        # {% generation %}...{% endgeneration %} marks assistant text for training masks; render it as is.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Not jinja's own tojson: that one escapes HTML characters, transformers' does not.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TokenizerError(f"[tokenizer] {where}: chat template has a syntax error (line {e.lineno}): "
                             f"{e.message}") from None


# ---------------------------------------------------------------------------- streaming


class StreamDecoder:
    """Incremental detokenizer: ``add(id)`` returns the text that id completes, maybe "".

    Text is only released once it decodes to complete UTF-8 (a character split across
    byte-level tokens is held back until its last byte arrives). Each step decodes just
    the ids since the last release (plus the previous piece, for context), so the cost
    per token stays constant. ``flush()`` releases whatever is held at the end.
    """

    # A UTF-8 character has at most 4 bytes and every token at least one: after this many
    # held ids the replacement character is real (invalid bytes), not an unfinished char.
    _MAX_HELD = 8

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # everything released so far
        self._prefix = 0  # ids[_prefix:_read] decode to the last released piece
        self._read = 0

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        held = len(self.ids) - self._read
        if len(now) > len(before) and (not now.endswith("\ufffd") or held >= self._MAX_HELD):
            piece = now[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += piece
            return piece
        return ""

    def extend(self, token_ids: Iterable[int]) -> str:
        return "".join(self.add(t) for t in token_ids)

    def flush(self) -> str:
        """Releases held ids even if they end in an incomplete character (as U+FFFD)."""
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        piece = now[len(before):] if now.startswith(before) else ""
        self._prefix = self._read = len(self.ids)
        self.text += piece
        return piece


def find_stop(text: str, stop_strings: Sequence[str]) -> tuple[int | None, int]:
    """(start of the earliest stop string in ``text`` or None, length of text safe to emit).

    Without a match, the safe length excludes the longest tail of ``text`` that is the
    beginning of some stop string (it may still become one); with a match it is the
    match's start.
    """
    stops = [s for s in stop_strings if s]
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        first = min(hits)
        return first, first
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return None, len(text) - hold


class StopMatcher:
    """Feeds generated text through stop strings: ``feed(piece) -> (safe text, stopped)``.

    Only text that cannot be the start of a stop string is released; once a stop string
    appears, the text before it is released, ``stopped`` becomes true and later input is
    ignored. ``flush()`` releases the held tail when generation ends without a stop.
    """

    def __init__(self, stop_strings: Sequence[str]):
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        self.stop_strings = [s for s in stop_strings if s]
        self.stopped = False
        self.stop: str | None = None  # which stop string matched
        self._held = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        # Earlier text was released only when no stop string could start in it, so
        # searching the held tail plus the new piece finds every match.
        window = self._held + piece
        at, safe = find_stop(window, self.stop_strings)
        if at is not None:
            self.stopped = True
            self.stop = next(s for s in self.stop_strings if window.startswith(s, at))
            self._held = ""
            return window[:at], True
        self._held = window[safe:]
        return window[:safe], False

    def flush(self) -> str:
        out, self._held = ("" if self.stopped else self._held), ""
        return out
