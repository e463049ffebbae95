"""`metalqwen serve --draft PATH` (DFlash drafting, issue 28) end to end through the official `openai`
client: greedy completions give plain decoding's text, the rounds are counted in /metrics, and
the server runs one sequence at a time (DFlash does not batch yet), said at start; an explicit
--max-sequences above 1 is refused before the load, naming --max-sequences 1."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

import metalqwen
from metalqwen.checkpoint import load_checkpoint

from ..support import dflash_fixtures as df
from ..support.model_checks import prompt
from ..support.require import require
from ..support.server_fixtures import free_port, wait_until_serving


@pytest.fixture(scope="module")
def target(converted):
    return converted("base")[1]


@pytest.fixture(scope="module")
def drafter(target, tmp_path_factory):
    cfg = load_checkpoint(target).config
    return df.write_drafter(tmp_path_factory.mktemp("dflash") / "drafter",
                            df.drafter_config(cfg, target_layer_ids=(1, 3)), seed=3)


def _serve(target, drafter, device, *extra) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "metalqwen.cli", "serve", "-m", target, "--draft", drafter,
                             "--device", device.kind, "--port", str(port), "--max-context", "256", *extra],
                            stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


def test_serve_with_a_drafter_gives_plain_decodings_text(target, drafter, device):
    openai = require("openai")
    plain_model = metalqwen.load(target, device=device, max_context=256, progress=False)
    ids = prompt(plain_model.config.vocab_size, 24, seed=21)
    plain = plain_model.generate(ids, max_tokens=40, temperature=0.0)
    proc, url = _serve(target, drafter, device)
    try:
        wait_until_serving(proc, url, 180)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        got = client.completions.create(model="m", prompt=ids, max_tokens=40, temperature=0)
        assert got.choices[0].text == plain.text
        assert got.usage.completion_tokens == len(plain.tokens)
        metrics = httpx.get(url + "/metrics").text
        rounds = [line for line in metrics.splitlines() if line.startswith("metalqwen_verify_steps_total")]
        assert rounds and float(rounds[0].split()[-1]) > 0, metrics
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        stderr = proc.stderr.read()
        proc.stderr.close()
    assert "--draft: one sequence at a time" in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_serve_with_a_drafter_refuses_batching_by_name(target, drafter, device):
    proc, _ = _serve(target, drafter, device, "--max-sequences", "2")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "--draft (DFlash) does not batch yet: it takes --max-sequences 1" in stderr, stderr
