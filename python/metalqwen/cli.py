"""The `metalqwen` command."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import Callable

import numpy as np

from . import __version__, _core, arguments, gpu, sampling
from .disk_cache import DEFAULT_BUDGET
from .errors import MetalqwenError

MODEL_HELP = ("an MLX-format Qwen3.5 checkpoint folder, or a Hugging Face model id such as "
              "mlx-community/Qwen3.5-9B-4bit (downloaded once into the Hugging Face cache; HF_HUB_OFFLINE=1 uses "
              "the cache only)")

_SMOKE_KERNEL = """
#include <metal_stdlib>
using namespace metal;

// out[i] = sum of x over i's SIMD-group, scaled: exercises dispatch, bindings and a collective.
kernel void smoke_simd_sum(device const float* x [[buffer(0)]],
                           device float* out [[buffer(1)]],
                           constant float& scale [[buffer(2)]],
                           uint i [[thread_position_in_grid]])
{
    out[i] = simd_sum(x[i]) * scale;
}
"""


def _devices(args: argparse.Namespace) -> int:
    """Runs a small kernel on every available device and checks the result; says why Metal is
    missing, if it is, and which device ``gpu.Device()`` picks."""
    x = np.arange(256, dtype=np.float32)
    want = np.repeat(x.reshape(-1, 32).sum(axis=1), 32) * 0.5
    failed = 0
    reason = gpu.metal_unavailable_reason()
    if reason:
        print(f"metal  unavailable: {reason}")
    for kind in gpu.available_kinds():
        start = time.perf_counter()
        dev = gpu.Device(kind)
        kernel = dev.compile(_SMOKE_KERNEL, "smoke.metal").kernel("smoke_simd_sum")
        out = dev.empty(x.nbytes)
        kernel.dispatch({0: dev.buffer(x), 1: out, 2: np.float32(0.5)}, threadgroups=(2,), threads=(128,))
        ok = np.array_equal(out.numpy(np.float32), want)
        failed += not ok
        print(f"{kind:6s} {dev.name}: {'ok' if ok else 'WRONG RESULT'} ({time.perf_counter() - start:.1f} s)")
    try:
        print(f"default: {gpu.Device().kind}")
    except gpu.GpuError as e:
        print(f"default: none: {e}")
        failed += 1
    return 1 if failed else 0


def _load(args: argparse.Namespace):
    from .loading import load

    distributed = getattr(args, "distributed", None)
    cache_gb = getattr(args, "cache_gb", None)
    cache_gb = cache_gb if cache_gb is not None else _CACHE_GB.get(args.command, 0.0)
    max_sequences = getattr(args, "max_sequences", None)
    draft = getattr(args, "draft", None)
    if max_sequences is None and draft is not None and _MAX_SEQUENCES.get(args.command, 1) > 1:
        # DFlash drafts for one sequence at a time: requests take turns (said at start, not at a request).
        print("metalqwen: --draft: one sequence at a time (DFlash does not batch yet: requests take turns; "
              "docs/speculative.md)", file=sys.stderr)
        max_sequences = 1
    max_sequences = max_sequences if max_sequences is not None else _MAX_SEQUENCES.get(args.command, 1)
    cache_dir, cache_dir_gb = getattr(args, "cache_dir", None), getattr(args, "cache_dir_gb", DISK_CACHE_GB)
    if cache_dir_gb <= 0:
        raise ValueError(f"--cache-dir-gb must be > 0, got {cache_dir_gb}")
    return load(args.model, device=args.device, max_context=args.max_context, kv_bits=args.kv_bits,
                progress=True if args.progress else None, prefix_cache_bytes=int(cache_gb * 2**30),
                speculative=args.speculative, draft_depth=args.draft_depth, max_sequences=max_sequences,
                distributed=distributed, layer_split=getattr(args, "layer_split", None),
                distributed_timeout=getattr(args, "distributed_timeout", 60.0), draft=getattr(args, "draft", None),
                cache_dir=cache_dir, cache_dir_bytes=int(cache_dir_gb * 2**30))


# Per command: --cache-gb and --max-sequences when not given.
_CACHE_GB = {"chat": 1.0, "serve": 2.0}
DISK_CACHE_GB = DEFAULT_BUDGET / 2**30  # --cache-dir-gb
_MAX_SEQUENCES = {"serve": 4}


def _on_ranks(model, work: Callable[[], int]) -> int:
    """The command's ``work()``: alone, or on rank 0 of a pipeline with the other ranks following
    its calls (silent: they print only errors)."""
    if getattr(model, "group", None) is None:
        return work()
    with _follower(model):
        code = model.lead_with(work)
    return 0 if code is None else code


def _follower(model) -> contextlib.AbstractContextManager:
    """Silences a pipeline rank other than 0 (it runs every step, rank 0 prints); else nothing."""
    if getattr(model, "rank", 0) == 0:
        return contextlib.nullcontext()
    quiet = contextlib.ExitStack()
    sink = quiet.enter_context(open(os.devnull, "w"))
    quiet.enter_context(contextlib.redirect_stdout(sink))
    quiet.enter_context(contextlib.redirect_stderr(sink))
    return quiet


def _check_max_sequences(value: int | None, draft: str | None = None) -> None:
    """--max-sequences (and with --draft), checked before the (possibly long) load."""
    most = _core.MAX_SEQUENCES
    allowed = f"an integer in 1..{most} (one step holds at most {most} sequences)"
    if value is not None and arguments.integer("--max-sequences", value, low=1, allowed=allowed) > most:
        raise ValueError(f"--max-sequences must be {allowed}, got {value}")
    if draft is not None and value is not None and value > 1:
        raise ValueError(f"--draft (DFlash) does not batch yet: it takes --max-sequences 1 (the default with "
                         f"--draft: requests take turns), got --max-sequences {value}")


# The temperature the command line uses when neither the user nor generation_config.json sets one.
_TEMPERATURE = 0.0  # greedy


def _options(args: argparse.Namespace) -> dict:
    """The generation options the user gave (sampling fields left out are None), checked
    before the (possibly long) load."""
    arguments.integer("--max-tokens", args.max_tokens, low=1, allowed="an integer >= 1")
    given = {k: getattr(args, k) for k in sampling.FIELDS}
    sampling.check(**sampling.with_defaults(given, {}, _TEMPERATURE), seed=args.seed)
    return dict(max_tokens=args.max_tokens, seed=args.seed, **given, **_constraint(args))


def _constraint(args: argparse.Namespace) -> dict:
    """--json-schema, --json-schema-file or --grammar-file as stream()'s json_schema/grammar, files
    read and JSON parsed before the load (the schema's and grammar's meaning is checked at the first
    answer, against the tokenizer)."""
    if args.json_schema is not None:
        return dict(json_schema=_json_text("--json-schema", args.json_schema))
    if args.json_schema_file is not None:
        return dict(json_schema=_json_text(f"--json-schema-file {args.json_schema_file}",
                                           _read_text(args.json_schema_file)))
    if args.grammar_file is not None:
        return dict(grammar=_read_text(args.grammar_file))
    return {}


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _json_text(what: str, text: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"{what}: not JSON: {e}") from None


def _with_folder_sampling(options: dict, model) -> dict:
    """Fills the sampling fields the user left out from the folder's generation_config.json
    (Qwen's recommended settings), else greedy and neutral: the rule of every front end."""
    return {**options, **sampling.with_defaults(options, model.config.sampling_defaults, _TEMPERATURE)}


class _AnswerPrinter:
    """Prints an answer as it streams: on a terminal the thinking dimmed apart from the answer,
    elsewhere the text as generated; with ``hide_thinking`` only the answer."""

    _DIM, _PLAIN = "\033[2m", "\033[0m"

    def __init__(self, opens_thinking: bool, hide_thinking: bool, terminal: bool):
        from .server.output_parser import OutputParser

        # Off a terminal the text goes out as generated, unless the thinking is to be left out.
        self.parser = OutputParser(in_reasoning=opens_thinking) if terminal or hide_thinking else None
        self.hide = hide_thinking
        self.in_thinking = False

    def _write(self, text: str) -> None:
        print(text, end="", flush=True)

    def _show(self, reasoning: str, content: str) -> None:
        if reasoning and not self.hide:
            self._write(self._DIM + reasoning + self._PLAIN)
            self.in_thinking = True
        if content:
            if self.in_thinking:  # the answer starts on a line of its own
                self._write("\n\n")
                self.in_thinking = False
            self._write(content)

    def feed(self, text: str) -> None:
        if self.parser:
            d = self.parser.feed(text)
            self._show(d.reasoning, d.content)
        else:
            self._write(text)

    def finish(self) -> None:
        if self.parser:
            d = self.parser.finish()
            self._show(d.reasoning, d.content)
        print(flush=True)


def _print_stream(model, prompt, options: dict, opens_thinking: bool, hide_thinking: bool = False) -> str:
    """Streams the answer to stdout (see _AnswerPrinter); returns its text as generated. A Ctrl-C
    stops it (the engine's state keeps what was fed) and propagates once the line is ended."""
    text = []
    printer = _AnswerPrinter(opens_thinking, hide_thinking, sys.stdout.isatty())
    with contextlib.closing(model.stream(prompt, **options)) as chunks, _between_tokens(model) as interrupted:
        try:
            for chunk in chunks:
                printer.feed(chunk.text)
                text.append(chunk.text)
                if interrupted:
                    raise KeyboardInterrupt
        finally:
            printer.finish()
    return "".join(text)


@contextlib.contextmanager
def _between_tokens(model):
    """On a pipeline's rank 0, a Ctrl-C is held until the next chunk (a list that is then not
    empty), so that the ranks stop together between two steps; elsewhere it interrupts at once."""
    caught: list[int] = []
    if getattr(model, "group", None) is None or threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


def _conversation(args: argparse.Namespace, model, system: str | None = None):
    """A Conversation rendered with the template options of the command line."""
    from .conversation import Conversation
    from .images import image_tokens

    counts = None if model.vision is None else (lambda p: image_tokens(p.height, p.width, model.vision.processor))
    return Conversation(model.tokenizer, system=system, enable_thinking=False if args.no_think else None,
                        template_kwargs=args.chat_template_kwargs, image_tokens=counts)


def _stop_reason(model) -> str:
    s = model.last_stats
    if s.context_full:
        return f"context full (max_context {model.max_context})"
    return "end of answer" if model.last_finish_reason == "stop" else "max tokens"


def _report(model, stats: bool) -> None:
    """Speed and why the answer ended; with ``stats`` (--stats) the engine's counters too."""
    s, c = model.last_stats, model.config
    reused = f" ({s.prompt_tokens_reused} reused)" if s.prompt_tokens_reused else ""
    print(f"prompt: {s.prompt_tokens} tokens{reused}, {s.prompt_tokens_per_second:.1f} tok/s | "
          f"decode: {s.generated_tokens} tokens, {s.decode_tokens_per_second:.1f} tok/s | "
          f"stopped: {_stop_reason(model)}", file=sys.stderr)
    if stats:
        # What a decode step streams: for MoE models the router, shared expert and chosen experts only.
        active = f" (active experts: {c.num_experts_per_tok} of {c.num_experts})" if c.is_moe else ""
        print(f"engine: {s.engine.get('dispatches_last_step', 0)} dispatches, "
              f"{s.engine.get('barriers_last_step', 0)} barriers per step | "
              f"{s.engine.get('weight_bytes_per_token', 0) / 1e6:.1f} MB of weights per token{active}", file=sys.stderr)
    disk = model.prefix_cache.disk if model.prefix_cache is not None else None
    if stats and disk is not None:
        disk.flush(30.0)  # this answer's snapshots written, so the figures count them
        print(f"disk cache: {disk.hits} hits, {disk.writes} files written ({disk.bytes_written / 1e6:.1f} MB), "
              f"{disk.bytes / 1e6:.1f} MB in {disk.folder}", file=sys.stderr)
    # Speculation that accepted nothing is a developer figure; accepted drafts are the user's speed-up.
    if model.speculative != "off" and (stats or s.accepted):
        print(f"speculative ({model.speculative}): {_speculation(s)}", file=sys.stderr)


def _speculation(s) -> str:
    if not s.verify_steps:
        return "no verify steps (no drafts, or penalties on)"
    by_depth = "/".join(f"{a:.2f}" for a in s.acceptance_at)
    return (f"{s.verify_steps} verify steps, {s.tokens_per_verify_step:.2f} tokens per step, "
            f"acceptance {s.acceptance:.2f} ({s.accepted} of {s.drafted} drafts; by depth {by_depth})")


def _prompt_text(args: argparse.Namespace) -> str:
    """-p TEXT, -p - (standard input) or --prompt-file PATH, read before the (possibly long) load."""
    if args.prompt_file is not None:
        with open(args.prompt_file, encoding="utf-8") as f:
            return f.read()
    return sys.stdin.read() if args.prompt == "-" else args.prompt


def _generate(args: argparse.Namespace) -> int:
    options = _options(args)
    prompt = _prompt_text(args)
    for path in args.image:  # before the (possibly long) load; decoding errors name the image later
        if not os.path.isfile(path):
            raise ValueError(f"--image {path}: no such file")
    if args.image:
        options["images"] = args.image
    model = _load(args)
    options = _with_folder_sampling(options, model)
    with _follower(model):
        if args.raw:
            _print_stream(model, prompt, options, opens_thinking=False, hide_thinking=args.hide_thinking)
        else:
            from .images import IMAGE_TEXT

            # The images first, then the text, in one user message (mlx-vlm's order); the template
            # renders each image's place, stream() fills it with the image's features.
            chat = _conversation(args, model).prompt(IMAGE_TEXT * len(args.image) + prompt)
            # With --cache-dir: a snapshot where the user's message ends, for a rerun to resume from.
            _print_stream(model, chat.ids, dict(options, boundaries=chat.boundaries), chat.opens_thinking,
                          args.hide_thinking)
        _report(model, args.stats)
    return 0


def _ask(question: str) -> bool:
    """A yes/no question on the terminal; yes unless the answer starts with n (Ctrl-D: no)."""
    try:
        return not input(f"{question} [Y/n] ").strip().lower().startswith("n")
    except EOFError:
        print()
        return False


_CHAT_HELP = """commands: /clear starts a fresh conversation; /system TEXT sets the system message (and starts
afresh); /image PATH attaches a picture to your next message (models with a vision tower; the
pictures stay in the conversation); /exit quits (as Ctrl-D
does); /help shows this. A line of three double quotes (\"\"\") starts
a message of several lines, ended by another such line; a pasted block is one message too.
Ctrl-C stops an answer."""


def _read_message() -> str | None:
    """The next message from the prompt: one line, or the lines between two \"\"\" lines; None at Ctrl-D."""
    try:
        line = input("> ")
        if line.strip() != '"""':
            return line.rstrip("\n")  # a pasted block brings its last newline
        lines = []
        while (more := input(". ")).strip() != '"""':
            lines.append(more)
        return "\n".join(lines)
    except EOFError:
        print()
        return None


def _chat(args: argparse.Namespace) -> int:
    """Multi-turn chat rendered by the template each turn; the prefix cache resumes each turn at
    the end of the previous user message (see Conversation)."""
    with contextlib.suppress(ImportError):
        import readline  # line editing and history for input()

        if "libedit" not in (readline.__doc__ or ""):
            # A block pasted into a terminal arrives as one message (Python turns this off by default).
            readline.parse_and_bind("set enable-bracketed-paste on")

    options = _options(args)
    model = _load(args)
    options = _with_folder_sampling(options, model)
    return _on_ranks(model, lambda: _chat_turns(args, model, options))


def _chat_turns(args: argparse.Namespace, model, options: dict) -> int:
    """Reads messages and prints answers until Ctrl-D or /exit."""
    conversation = _conversation(args, model, system=args.system)
    # A new turn wants room for an answer: max_tokens, or half the context when that is less.
    answer_room = min(args.max_tokens, model.max_context // 2)
    attached = []  # pictures for the next message (/image)
    print("metalqwen chat: Ctrl-C stops an answer, Ctrl-D or /exit quits, /help lists the commands",
          file=sys.stderr)
    while True:
        line = _read_message()
        if line is None:
            return 0
        command, _, rest = line.strip().partition(" ")
        if command in ("/exit", "/quit"):
            return 0
        if command == "/help":
            print(_CHAT_HELP, file=sys.stderr)
            continue
        if command in ("/clear", "/system"):
            system = (rest.strip() or None) if command == "/system" else conversation.system
            conversation, attached = _conversation(args, model, system=system), []
            print(f"(fresh conversation{', system message set' if command == '/system' else ''})", file=sys.stderr)
            continue
        if command == "/image":
            picture = _attach(model, rest.strip())
            if picture is not None:
                attached.append(picture)
            continue
        if command.startswith("/") and command[1:].isalpha():
            print(f"(unknown command {command}: /help lists them)", file=sys.stderr)
            continue
        if not line.strip():
            print("(empty message: type some text, or Ctrl-D to quit)", file=sys.stderr)
            continue
        prompt = conversation.prompt(line, attached)
        if prompt.length + answer_room > model.max_context:
            if not _ask(f"the context is full ({prompt.length} tokens with your message; max_context "
                        f"{model.max_context}). Continue in a fresh context keeping the last turns that fit?"):
                print("(message dropped; Ctrl-D quits)", file=sys.stderr)
                continue
            prompt = conversation.restart(line, model.max_context - answer_room, attached)
            print(f"(fresh context: {len(conversation.turns)} earlier turns kept)", file=sys.stderr)
        try:
            reply = _print_stream(model, prompt.ids, dict(options, boundaries=prompt.boundaries, images=prompt.images),
                                  prompt.opens_thinking, args.hide_thinking)
        except KeyboardInterrupt:
            print("(answer stopped)", file=sys.stderr)
            reply = model.tokenizer.decode(model.last_tokens, skip_special_tokens=True)
        conversation.record(prompt, line, reply, attached)
        attached = []
        _report(model, args.stats)


def _attach(model, path: str):
    """The picture at ``path`` for chat's next message (decoded now), or None after saying why not."""
    from .images import image_tokens
    from .vision_preprocess import load_image

    if model.vision is None:
        print(f"(this model takes no images: {model.no_vision})", file=sys.stderr)
        return None
    if not path:
        print("(/image needs a path: /image PATH)", file=sys.stderr)
        return None
    try:
        picture = load_image(os.path.expanduser(path))
    except (OSError, ValueError) as e:  # a missing file, or not a picture Pillow reads
        print(f"(cannot attach {path}: {e})", file=sys.stderr)
        return None
    tokens = image_tokens(picture.height, picture.width, model.vision.processor)
    print(f"(attached {path}: {picture.width} x {picture.height}, {tokens} prompt tokens; it goes with your next "
          "message)", file=sys.stderr)
    return picture


def _demo(args: argparse.Namespace) -> int:
    """Writes a tiny random Qwen3.5 checkpoint in MLX format and generates from it."""
    import shutil
    import tempfile

    from .conversation import Conversation
    from .demo_checkpoint import write_demo_checkpoint
    from .loading import load

    if args.hf:
        from .demo_checkpoint import write_hf_demo_checkpoint

        write_hf_demo_checkpoint(args.hf)
        mlx = os.path.join(os.path.dirname(os.path.abspath(args.hf)), os.path.basename(os.path.normpath(args.hf)) + "-mlx")
        print(f"metalqwen: wrote a Hugging Face-format original with an MTP head (random weights) to {args.hf}; "
              f"try:\n  metalqwen convert {args.hf} {mlx}\n  metalqwen generate -m {mlx} --speculative mtp -p Hi",
              file=sys.stderr)
        return 0
    folder = args.keep or tempfile.mkdtemp(prefix="metalqwen-demo-")
    try:
        write_demo_checkpoint(folder, seed=0)
        print(f"demo checkpoint (random weights, so the text is noise) in {folder}", file=sys.stderr)
        model = load(folder, device=args.device, max_context=512, progress=True if args.progress else None)
        print(f"> {args.prompt}", flush=True)
        chat = Conversation(model.tokenizer).prompt(args.prompt)
        text = _print_stream(model, chat.ids, dict(max_tokens=args.max_tokens, temperature=0.0), chat.opens_thinking)
        _report(model, args.stats)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if text else 1


def _serve(args: argparse.Namespace) -> int:
    from .server.graceful import listening_socket
    from .server.image_parts import ImagePolicy

    _check_max_sequences(args.max_sequences, args.draft)
    if args.allowed_image_dir is not None and not os.path.isdir(args.allowed_image_dir):
        raise ValueError(f"--allowed-image-dir {args.allowed_image_dir} is not a directory")
    flags = {"max_images": "--max-images", "max_pixels": "--max-image-pixels", "fetch_bytes": "--fetch-max-bytes",
             "fetch_seconds": "--fetch-timeout"}
    limits = {name: getattr(args, name) for name in flags if getattr(args, name) is not None}  # else the default
    for name, value in limits.items():
        if value <= 0:
            raise ValueError(f"{flags[name]} must be positive, got {value}")
    images = ImagePolicy(allowed_dir=args.allowed_image_dir, fetch=args.fetch_images, **limits)
    if args.distributed:  # only rank 0 listens: its port is known once the ranks are up
        model = _load(args)
        return _on_ranks(model, lambda: _serve_http(args, model, images, listening_socket(args.host, args.port)))
    sock = listening_socket(args.host, args.port)  # before the (possibly long) load: a busy port fails at once
    try:
        model = _load(args)
    except BaseException:
        sock.close()
        raise
    return _serve_http(args, model, images, sock)


def _serve_http(args: argparse.Namespace, model, images, sock) -> int:
    """Serves on ``sock`` (closed at the end) until SIGINT/SIGTERM (exit 0) or a pipeline rank
    fails (every request then gets 503, and the error is raised once the server has stopped)."""
    from .server import access_log, create_app
    from .server.graceful import GracefulServer

    failed = []

    def rank_failed(error: Exception) -> None:  # called by the engine thread
        failed.append(error)
        server.should_exit = True

    with sock:
        access_log.configure(args.log_level)
        app = create_app(model, api_key=args.api_key, max_queue=args.max_queue, public_metrics=args.public_metrics,
                         cors_origins=args.cors_origin, images=images, on_fatal=rank_failed)
        memory = model.counters()["memory_estimate"] / 2**30

        first, end = model.layers if args.distributed else (0, 0)
        turns = "; requests one at a time across the ranks" if model.max_sequences == 1 else ""
        ranks = f" on rank 0 of {model.group.size} (layers {first}:{end}{turns})" if args.distributed else ""

        def say_serving() -> None:
            print(f"metalqwen: serving {args.model} on http://{args.host}:{args.port}/ (API under /v1), "
                  f"{model.max_sequences} sequence slot(s) of {model.max_context} tokens, {memory:.2f} GiB of GPU "
                  f"memory{ranks}", file=sys.stderr, flush=True)

        server = GracefulServer(app, sock, say_serving, log_level="warning")
        server.serve_until_signal()
    if failed:
        raise failed[0]
    return 0


def _convert(args: argparse.Namespace) -> int:
    from .convert import convert

    out = convert(args.hf_dir, args.out_dir, bits=args.bits, group_size=args.group_size, mtp=args.mtp,
                  quantize=not args.no_quantize, vision=args.vision, progress=True)
    print(f"metalqwen: wrote {out}", file=sys.stderr)
    return 0


def _add_mtp(args: argparse.Namespace) -> int:
    from .convert import add_mtp

    print(f"metalqwen: wrote {add_mtp(args.hf_dir, args.mlx_dir, progress=True)}", file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import run
    from .bench_pipeline import run as run_pipeline

    if args.max_context is not None:
        arguments.integer("--max-context", args.max_context, low=2, allowed="an integer >= 2")
    if args.decode_tokens is not None:
        arguments.integer("--decode-tokens", args.decode_tokens, low=1, allowed="an integer >= 1")
    _check_max_sequences(args.max_sequences, args.draft)
    return run_pipeline(args) if args.distributed else run(args)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def _add_common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["metal", "cpu"], default=None,
                   help="metal (Apple GPU) or cpu (the CPU runtime); default: metal where available")
    p.add_argument("--progress", action="store_true",
                   help="show load and prompt progress on stderr even when it is not a terminal")


def _add_stats_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--stats", action="store_true",
                   help="after each answer also print the engine's counters: dispatches and barriers per step, "
                        "weight bytes per token, speculative decoding's figures")


def _add_speculative_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative", choices=["auto", "mtp", "lookup", "dflash", "off"], default="auto",
                   help="draft tokens and verify several per step, same output: mtp = the checkpoint's MTP head "
                        "(see convert / add-mtp), lookup = prompt lookup (n-grams of the prompt and answer), dflash = "
                        "the DFlash drafter given by --draft; auto (default) = dflash with --draft, else mtp when the "
                        "folder has the head, else lookup")
    p.add_argument("--draft", metavar="PATH", default=None,
                   help="a DFlash drafter folder for this model (z-lab's block-diffusion drafters; docs/speculative.md)")
    p.add_argument("--draft-depth", type=int, default=None,
                   help=f"most drafts per verify step, 1..{_core.MAX_DRAFT} (default 3 with mtp, 4 with lookup, the "
                        f"most that fit with dflash); each reserves a copy of the recurrent state")


def _add_distributed_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--distributed", choices=["pipeline"], default=None,
                   help="under mlx.launch: the layers spread over its ranks, rank 0 printing, reading the terminal "
                        "or serving (docs/distributed.md; every rank gets the same arguments)")
    p.add_argument("--layer-split", metavar="RANGES", default=None,
                   help="with --distributed: each rank's layers, e.g. 0:20,20:40 (default: in proportion to each "
                        "rank's GPU memory)")
    p.add_argument("--distributed-timeout", metavar="SECONDS", type=float, default=60.0,
                   help="with --distributed: how long a rank waits for another within a step before it stops "
                        "with an error (default 60)")


def _add_disk_cache_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help="also keep the prefix cache's saved states as files in DIR (made if missing), so a long "
                        "system prompt or conversation resumes after a restart; files are checksummed and tied to "
                        "this model and its options (others are ignored with a warning)")
    p.add_argument("--cache-dir-gb", metavar="GB", type=float, default=DISK_CACHE_GB,
                   help=f"most GiB of files in --cache-dir, least recently used removed first (default "
                        f"{DISK_CACHE_GB:g})")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help=MODEL_HELP)
    _add_common_options(p)
    _add_disk_cache_options(p)
    _add_stats_option(p)
    _add_speculative_options(p)
    p.add_argument("--max-context", type=int, default=4096,
                   help="prompt + generated tokens the caches hold (default 4096)")
    p.add_argument("--kv-bits", type=int, choices=[8, 16], default=8, help="KV cache: 8 = q8 (default), 16 = f16")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens per answer (default 512)")
    p.add_argument("--no-think", action="store_true",
                   help="ask the model to answer without thinking (the chat template's enable_thinking=false)")
    p.add_argument("--chat-template-kwargs", metavar="JSON", type=_json_object, default=None,
                   help='further chat template variables as a JSON object, e.g. \'{"enable_thinking": false}\'')
    p.add_argument("--hide-thinking", action="store_true",
                   help="print only the answer, not the thinking before it (on a terminal the thinking is dimmed)")
    # Sampling: what the user leaves out comes from the folder's generation_config.json.
    folder = "default: the folder's generation_config.json, else"
    p.add_argument("--temperature", type=float, default=None, help=f"0 = greedy; else sampling ({folder} 0)")
    p.add_argument("--top-p", type=float, default=None, help=f"nucleus sampling mass in (0, 1] ({folder} 1 = off)")
    p.add_argument("--top-k", type=int, default=None, help=f"sample among the k likeliest tokens ({folder} 0 = off)")
    p.add_argument("--min-p", type=float, default=None,
                   help=f"keep tokens at least this fraction as likely as the top one ({folder} 0 = off)")
    p.add_argument("--presence-penalty", type=float, default=None,
                   help=f"subtracted from the logit of every token already generated, in [-2, 2] ({folder} 0)")
    p.add_argument("--frequency-penalty", type=float, default=None,
                   help=f"subtracted per earlier occurrence in the answer, in [-2, 2] ({folder} 0)")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="divides the positive (multiplies the negative) logits of tokens in the prompt or answer "
                        f"({folder} 1 = off)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    # Structured output: every answer follows the schema or grammar (after the thinking, if any).
    constrained = p.add_mutually_exclusive_group()
    constrained.add_argument("--json-schema", metavar="JSON",
                             help="answer with one JSON value valid against this JSON schema (given inline)")
    constrained.add_argument("--json-schema-file", metavar="PATH", help="as --json-schema, the schema read from PATH")
    constrained.add_argument("--grammar-file", metavar="PATH",
                             help="answer in the grammar in PATH: Lark, or GBNF (rules written name ::= ...)")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metalqwen", description="Qwen3.5-family models on Apple GPUs.")
    parser.add_argument("--version", action="version", version=f"metalqwen {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    devices = commands.add_parser("devices", help="list the GPU devices and run a smoke kernel on each")
    devices.set_defaults(run=_devices)
    generate = commands.add_parser("generate", help="stream a reply to one prompt, then speed figures")
    _add_model_options(generate)
    prompt = generate.add_mutually_exclusive_group(required=True)
    prompt.add_argument("-p", "--prompt", help="the prompt (a user message unless --raw); - reads standard input")
    prompt.add_argument("--prompt-file", metavar="PATH", help="read the prompt from a UTF-8 text file")
    generate.add_argument("--raw", action="store_true", help="feed the prompt as is (no chat template)")
    generate.add_argument("--image", metavar="PATH", action="append", default=[],
                          help="an image before the prompt's text (repeat for several; folders with a vision tower, "
                               "as mlx_vlm.convert writes them)")
    _add_distributed_options(generate)
    generate.set_defaults(run=_generate)
    chat = commands.add_parser("chat", help="multi-turn chat in the terminal")
    _add_model_options(chat)
    chat.add_argument("--system", default=None, help="a system message for the conversation")
    chat.add_argument("--cache-gb", type=float, default=None,
                      help="device memory for the states saved at message ends, GiB (default 1; with --distributed "
                           "per rank, for its layers' states; 0 = off: a turn that does not extend the last one "
                           "re-reads the whole conversation)")
    _add_distributed_options(chat)
    chat.set_defaults(run=_chat)
    demo = commands.add_parser("demo", help="write a tiny random checkpoint and generate from it (works anywhere)")
    _add_common_options(demo)
    _add_stats_option(demo)
    demo.add_argument("--keep", metavar="DIR", default=None,
                      help="write the checkpoint to DIR and keep it (default: a temporary folder, removed after)")
    demo.add_argument("--hf", metavar="DIR", default=None,
                      help="instead, write a Hugging Face-format original with an MTP head to DIR (for trying "
                           "convert, add-mtp and --speculative mtp without a download) and stop")
    demo.add_argument("-p", "--prompt", default="Hello! Who are you?", help="the user message")
    demo.add_argument("--max-tokens", type=int, default=24, help="tokens to generate (default 24)")
    demo.set_defaults(run=_demo)
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions, ...)")
    serve.add_argument("-m", "--model", required=True, help=MODEL_HELP)
    _add_common_options(serve)
    _add_disk_cache_options(serve)
    _add_speculative_options(serve)
    serve.add_argument("--max-context", type=int, default=8192, help="prompt + generated tokens (default 8192)")
    serve.add_argument("--kv-bits", type=int, choices=[8, 16], default=8, help="KV cache: 8 = q8 (default), 16 = f16")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every route but the chat page and /health")
    serve.add_argument("--public-metrics", action="store_true",
                       help="answer /metrics without the API key (for Prometheus)")
    serve.add_argument("--cors-origin", metavar="ORIGIN", action="append", default=[],
                       help="let pages from ORIGIN (e.g. http://localhost:3000) call the API; repeatable (default: "
                            "none, the chat page needs none)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info",
                       help="info (default): one line per request on stderr (status, tokens, time to first token, "
                            "tok/s); warning: errors only")
    serve.add_argument("--max-queue", type=int, default=16, help="requests that may wait; more get 429 (default 16)")
    serve.add_argument("--cache-gb", type=float, default=None,
                       help="device memory for the prefix cache's saved states, GiB (default 2; with --distributed "
                            "per rank, for its layers' states; 0 = off)")
    serve.add_argument("--max-sequences", type=int, default=None,
                       help="requests decoded together, sharing each step's weight stream, 1..8 (default 4, with "
                            "--draft 1; 1 = one "
                            "at a time, the others wait); each reserves a KV cache of --max-context tokens and a "
                            "DeltaNet state (counted in the memory checked at load)")
    serve.add_argument("--allowed-image-dir", metavar="DIR", default=None,
                       help="serve image_url parts naming local files (file:// or a path) inside DIR, symlinks "
                            "resolved (default: none; data: URLs are always taken)")
    serve.add_argument("--fetch-images", action="store_true",
                       help="fetch http(s) image_url parts (default: refused), bounded by --fetch-max-bytes and "
                            "--fetch-timeout")
    # Defaults (None here): server.image_parts.ImagePolicy's, kept there only.
    serve.add_argument("--fetch-max-bytes", dest="fetch_bytes", metavar="BYTES", type=int, default=None,
                       help="largest image download in bytes (default 20 MiB)")
    serve.add_argument("--fetch-timeout", dest="fetch_seconds", metavar="SECONDS", type=float, default=None,
                       help="seconds an image download may take (default 10)")
    serve.add_argument("--max-images", metavar="N", type=int, default=None, help="images a request may carry (default 8)")
    serve.add_argument("--max-image-pixels", dest="max_pixels", metavar="N", type=int, default=None,
                       help="largest image as sent, width x height (default 40000000); the model's processor then "
                            "resizes it within its own pixel bounds")
    _add_distributed_options(serve)
    serve.set_defaults(run=_serve)
    bench = commands.add_parser("bench", help="prefill, time to first token and decode tok/s of a checkpoint "
                                "(--compare mlx-lm: side by side)")
    bench.add_argument("-m", "--model", required=True, help=MODEL_HELP)
    _add_common_options(bench)
    bench.add_argument("--kv-bits", type=int, choices=[8, 16], default=8, help="KV cache: 8 = q8 (default), 16 = f16")
    bench.add_argument("--max-context", type=int, default=None,
                       help="cache size; sizes that do not fit are clamped, and said so (default: what they need, "
                            "16K + the decoded tokens)")
    bench.add_argument("--decode-tokens", type=int, default=None, help="tokens per decode run (default 128; quick 8)")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes (prompts 32/64, contexts 0/64, 8 tokens): checks that everything runs")
    bench.add_argument("--speculative", choices=["auto", "mtp", "lookup", "dflash", "off"], default=None,
                       help="decode speculatively (greedy) and report tokens per verify step and acceptance by "
                            "depth (default: dflash with --draft, else off: plain decoding)")
    bench.add_argument("--draft", metavar="PATH", default=None,
                       help="a DFlash drafter folder for the model (--speculative dflash; docs/speculative.md)")
    bench.add_argument("--compare", choices=["mlx-lm"], default=None,
                       help="also run mlx-lm on the same folder and prompts, side by side with the ratio")
    bench.add_argument("--concurrency", metavar="C,C,...", default=None,
                       help="also decode C different prompts together (generate_batch) for each level, e.g. 1,2,4,8 "
                            "(each 1..8; 1 always runs: the baseline), and report aggregate and per-stream decode "
                            "tok/s and engine steps per level")
    bench.add_argument("--max-sequences", type=int, default=None,
                       help=f"sequence slots reserved at load, 1..{_core.MAX_SEQUENCES} (default: the largest "
                            "--concurrency level, else 1); each reserves a KV cache of max-context tokens and a "
                            "DeltaNet state")
    bench.add_argument("--json", metavar="FILE", default=None, help="write every figure to FILE as JSON")
    bench.add_argument("--plot", metavar="FILE", default=None,
                       help="draw decode tok/s against context (and, with --concurrency, aggregate tok/s against "
                            "the streams) to FILE (.png; needs matplotlib)")
    _add_distributed_options(bench)
    bench.set_defaults(run=_bench)
    convert = commands.add_parser("convert", help="a Hugging Face Qwen3.5 original -> an MLX folder, MTP head and "
                                  "vision tower kept")
    convert.add_argument("hf_dir", help="the original's folder (config.json, *.safetensors, tokenizer)")
    convert.add_argument("out_dir", help="the MLX folder to write (must not exist)")
    convert.add_argument("--bits", type=int, choices=[4, 8], default=4, help="affine quantization bits (default 4)")
    convert.add_argument("--group-size", type=int, choices=[32, 64, 128], default=64,
                         help="quantization group size (default 64)")
    convert.add_argument("--mtp", choices=["keep", "drop"], default="keep",
                         help="keep the multi-token-prediction head (default; mlx_lm.convert drops it)")
    convert.add_argument("--vision", choices=["keep", "drop"], default="keep",
                         help="keep the vision tower as mlx_vlm.convert writes it (default; drop: a text-only folder)")
    convert.add_argument("--no-quantize", action="store_true",
                         help="cast to the original's dtype without quantizing (--bits/--group-size unused)")
    convert.set_defaults(run=_convert)
    add_mtp = commands.add_parser("add-mtp", help="graft an original's MTP head into an MLX folder (mtp.safetensors)")
    add_mtp.add_argument("hf_dir", help="the original's folder: its index and the shards holding mtp.* suffice")
    add_mtp.add_argument("mlx_dir", help="the MLX folder converted from it")
    add_mtp.set_defaults(run=_add_mtp)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("metalqwen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`metalqwen generate ... | head`): stop quietly, as Unix tools do.
        # stdout is pointed at /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (MetalqwenError, ValueError, TypeError, OSError) as e:
        print(f"metalqwen: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
