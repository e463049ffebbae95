"""The `metalqwen` command."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import gpu

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
    from .model import load

    return load(args.model, device=args.device, max_context=args.max_context, kv_bits=args.kv_bits)


def _options(args: argparse.Namespace) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                seed=args.seed)


def _print_stream(model, prompt, options: dict, chat: bool) -> list[int]:
    tokens = []
    for chunk in model.stream(prompt, chat=chat, **options):
        print(chunk.text, end="", flush=True)
        if chunk.token is not None:
            tokens.append(chunk.token)
    print()
    return tokens


def _report(model) -> None:
    s, c = model.last_stats, model.config
    # What a decode step streams: for MoE models the router, shared expert and chosen experts only.
    active = f" (active experts: {c.num_experts_per_tok} of {c.num_experts})" if c.is_moe else ""
    print(f"prompt: {s.prompt_tokens} tokens, {s.prompt_tokens_per_second:.1f} tok/s | "
          f"decode: {s.generated_tokens} tokens, {s.decode_tokens_per_second:.1f} tok/s | "
          f"{s.engine.get('dispatches_last_step', 0)} dispatches per step | "
          f"{s.engine.get('weight_bytes_per_token', 0) / 1e6:.1f} MB of weights per token{active}", file=sys.stderr)


def _generate(args: argparse.Namespace) -> int:
    model = _load(args)
    _print_stream(model, args.prompt, _options(args), chat=not args.raw)
    _report(model)
    return 0


def _chat(args: argparse.Namespace) -> int:
    """Multi-turn chat; the cache is kept between turns (only new tokens are fed)."""
    model = _load(args)
    messages = []
    print("metalqwen chat: empty line or Ctrl-D to quit", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        ids = model.tokenizer.encode_chat(messages)
        reply = model.tokenizer.decode(_print_stream(model, ids, _options(args), chat=False), skip_special_tokens=True)
        messages.append({"role": "assistant", "content": reply})
        _report(model)
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Writes a tiny random Qwen3.5 checkpoint in MLX format and generates from it."""
    import tempfile

    from .demo_checkpoint import write_demo_checkpoint
    from .model import load

    folder = args.folder or tempfile.mkdtemp(prefix="metalqwen-demo-")
    write_demo_checkpoint(folder, seed=0)
    print(f"demo checkpoint (random weights) in {folder}", file=sys.stderr)
    model = load(folder, device=args.device, max_context=512)
    tokens = _print_stream(model, args.prompt, dict(max_tokens=args.max_tokens, temperature=0.0), chat=True)
    _report(model)
    return 0 if tokens else 1


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="an MLX-format Qwen3.5 checkpoint folder")
    p.add_argument("--device", choices=["metal", "cpu"], default=None, help="default: metal where available")
    p.add_argument("--max-context", type=int, default=4096, help="prompt + generated tokens (default 4096)")
    p.add_argument("--kv-bits", type=int, choices=[8, 16], default=8, help="KV cache: 8 = q8 (default), 16 = f16")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metalqwen", description="Qwen3.5-family models on Apple GPUs.")
    commands = parser.add_subparsers(dest="command", required=True)
    devices = commands.add_parser("devices", help="list the GPU devices and run a smoke kernel on each")
    devices.set_defaults(run=_devices)
    generate = commands.add_parser("generate", help="stream a reply to one prompt, then speed figures")
    _add_model_options(generate)
    generate.add_argument("-p", "--prompt", required=True)
    generate.add_argument("--raw", action="store_true", help="feed the prompt as is (no chat template)")
    generate.set_defaults(run=_generate)
    chat = commands.add_parser("chat", help="multi-turn chat in the terminal")
    _add_model_options(chat)
    chat.set_defaults(run=_chat)
    demo = commands.add_parser("demo", help="write a tiny random checkpoint and generate from it (works anywhere)")
    demo.add_argument("--folder", default=None, help="where to write it (default: a temporary folder)")
    demo.add_argument("--device", choices=["metal", "cpu"], default=None)
    demo.add_argument("-p", "--prompt", default="Hello! Who are you?")
    demo.add_argument("--max-tokens", type=int, default=24)
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (gpu.GpuError, ValueError, OSError) as e:
        print(f"metalqwen: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
