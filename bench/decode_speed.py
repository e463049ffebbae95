"""End-to-end speed: prompt and decode tokens per second, the share of the chip's memory
bandwidth a decode step reaches, and mlx-lm on the same machine for comparison.

    python bench/decode_speed.py -m PATH [--bandwidth-gbs 546] [--device metal] [--mlx-lm]

Decode is memory-bound: a step streams every weight once, so
bandwidth share = weight_bytes_per_token * decode tok/s / bandwidth.
On the CPU runtime the figures only show the engine works; they say nothing about a Mac.
"""

from __future__ import annotations

import argparse

import numpy as np

import metalqwen
from metalqwen.progress import phase


def random_prompt(vocab_size: int, n: int) -> list[int]:
    """The same prompt for every engine: ids drawn from the checkpoint's own vocabulary
    (the first 10000 ids at most: ordinary text tokens in real checkpoints)."""
    return [int(t) for t in np.random.default_rng(0).integers(0, min(vocab_size, 10000), n)]


def bench_metalqwen(args, prompt: list[int]) -> dict:
    phase("metalqwen: loading")
    model = metalqwen.load(args.model, device=args.device, max_context=args.prompt_tokens + args.decode_tokens + 8,
                           progress=True)
    phase("metalqwen: warm-up")
    model.generate(prompt[:8], max_tokens=4)  # pipelines, caches
    model.reset()
    phase(f"metalqwen: {args.prompt_tokens} prompt tokens, then {args.decode_tokens} decoded")
    out = model.generate(prompt, max_tokens=args.decode_tokens)
    s = out.stats
    return {
        "prompt tok/s": s.prompt_tokens_per_second,
        "decode tok/s": s.decode_tokens_per_second,
        "decoded": s.generated_tokens,
        "weight GB/token": s.engine["weight_bytes_per_token"] / 1e9,
        "dispatches/step": s.engine["dispatches_last_step"],
    }


def bench_mlx_lm(args, prompt: list[int]) -> dict:
    from mlx_lm import load, stream_generate

    phase("mlx-lm: loading")
    model, tokenizer = load(args.model)
    phase(f"mlx-lm: {args.prompt_tokens} prompt tokens, then {args.decode_tokens} decoded")
    last = None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=args.decode_tokens):
        pass
    return {"prompt tok/s": last.prompt_tps, "decode tok/s": last.generation_tps, "decoded": last.generation_tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="an MLX-format Qwen3.5 checkpoint folder")
    p.add_argument("--device", choices=["metal", "cpu"], default=None, help="default: metal where available")
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length (default 512)")
    p.add_argument("--decode-tokens", type=int, default=128, help="tokens to decode (default 128)")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="the chip's memory bandwidth, GB/s")
    p.add_argument("--mlx-lm", action="store_true", help="also run mlx-lm on the same checkpoint")
    args = p.parse_args()
    prompt = random_prompt(metalqwen.load_checkpoint(args.model).config.vocab_size, args.prompt_tokens)
    ours = bench_metalqwen(args, prompt)
    if args.bandwidth_gbs:
        ours["bandwidth share"] = ours["weight GB/token"] * ours["decode tok/s"] / args.bandwidth_gbs
    print("metalqwen:", {k: round(v, 3) for k, v in ours.items()})
    if args.mlx_lm:
        theirs = bench_mlx_lm(args, prompt)
        print("mlx-lm:   ", {k: round(v, 3) for k, v in theirs.items()})
        print(f"decode speed ratio metalqwen / mlx-lm: {ours['decode tok/s'] / theirs['decode tok/s']:.2f}")


if __name__ == "__main__":
    main()
