"""Time to first token through `metalqwen serve`, without and with a prefix-cache hit: two
chats share a long system prompt (~4K tokens by default) and differ in their question.
The first reads the whole prompt; the second resumes from the snapshot taken at the end of
the system prompt and reads only its question.

    python bench/server_ttft.py -m PATH [--prefix-tokens 4096] [--device metal] [--cache-gb 2]

On the CPU runtime the figures only show the path works; they say nothing about a Mac.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import httpx
import uvicorn

import metalqwen
from metalqwen.progress import phase
from metalqwen.server import create_app

_FILLER = ("The archive keeps letters, maps and ledgers from the harbour town, sorted by year and by the ship "
           "that carried them; each entry notes the sender, the cargo and the weather on the day it arrived. ")


def system_prompt(tokenizer, n: int) -> str:
    """About ``n`` tokens of ordinary prose."""
    text = _FILLER
    while len(tokenizer.encode(text)) < n:
        text += _FILLER
    return tokenizer.decode(tokenizer.encode(text)[:n])


def first_token(url: str, system: str, question: str, max_tokens: int) -> dict:
    """Seconds from sending the request to the first generated text, and the usage reported."""
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start, first, usage = time.perf_counter(), None, None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            delta = event["choices"][0]["delta"] if event["choices"] else {}
            if first is None and (delta.get("reasoning_content") or delta.get("content")):
                first = time.perf_counter() - start
            usage = event.get("usage") or usage
    return {"ttft s": first, "prompt tokens": usage["prompt_tokens"],
            "cached tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="an MLX-format Qwen3.5 checkpoint folder")
    p.add_argument("--device", choices=["metal", "cpu"], default=None, help="default: metal where available")
    p.add_argument("--prefix-tokens", type=int, default=4096, help="length of the shared system prompt (default 4096)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request (default 8)")
    p.add_argument("--cache-gb", type=float, default=2.0, help="prefix cache budget, GiB (default 2)")
    args = p.parse_args()

    phase("metalqwen: loading")
    model = metalqwen.load(args.model, device=args.device, max_context=args.prefix_tokens + 256 + args.max_tokens,
                           prefix_cache_bytes=int(args.cache_gb * 2**30), progress=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(model), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        phase("warm-up")  # pipelines and first allocations, on a prompt that shares nothing with the next ones
        first_token(url, "You are terse.", "Hello?", 2)
        system = system_prompt(model.tokenizer, args.prefix_tokens)
        phase(f"cold: a {args.prefix_tokens}-token system prompt, read in full")
        cold = first_token(url, system, "Which ship carried the most letters?", args.max_tokens)
        phase("hit: the same system prompt, another question")
        hit = first_token(url, system, "What did the ledgers record?", args.max_tokens)
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
    for name, row in (("cold", cold), ("hit", hit)):
        print(f"{name}: " + ", ".join(f"{k} {round(v, 3) if isinstance(v, float) else v}" for k, v in row.items()))
    print(f"time-to-first-token speed-up from the prefix cache: {cold['ttft s'] / hit['ttft s']:.1f}x")


if __name__ == "__main__":
    main()
