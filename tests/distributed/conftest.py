"""Launching ranks with mlx.launch (ring backend on loopback) and reading their results.

mlx.launch exits 0 whatever its ranks do, and its default ports (32323 + rank) collide when two
launches run at once: each launch gets free ports, an open stdin pipe, its own TMPDIR (each
rank leaves a pidfile and hostfile there), and each rank writes its result to a file."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from ..support.require import require

SCRIPT = os.path.join(os.path.dirname(__file__), "rank_script.py")


def free_ports(count: int) -> int:
    """A first port such that it and the next count - 1 are free now."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + count >= 65536:
            continue
        held = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no run of free ports")


@pytest.fixture(scope="session")
def tiny(ckpt_root):
    """A demo checkpoint small enough for several ranks on the CPU runtime: hidden 128, 4 layers
    (DeltaNet, attention, DeltaNet, attention), tied embeddings, 4-bit group 32."""
    from metalqwen.demo_checkpoint import write_demo_checkpoint

    return write_demo_checkpoint(os.path.join(ckpt_root, "pipeline-tiny"), seed=1, hidden_size=128,
                                 intermediate_size=128, linear_num_key_heads=1, linear_num_value_heads=1,
                                 full_attention_interval=2, group_size=32)


@pytest.fixture
def launch(tmp_path):
    """launch(checkpoint, scenario, ranks=2) -> [each rank's result dict] (rank_script.py; a rank that
    wrote none gets {"error": "no result", "message": what mlx.launch printed})."""
    require("mlx")
    launcher = shutil.which("mlx.launch")
    if launcher is None:
        pytest.fail("mlx.launch is not on PATH (pip install mlx[cpu])")

    def run(checkpoint: str, scenario: str, ranks: int = 2) -> list[dict]:
        out = tmp_path / scenario
        (out / "tmp").mkdir(parents=True)
        cmd = [launcher, "-n", str(ranks), "--backend", "ring", "--starting-port", str(free_ports(ranks)),
               "--python", sys.executable, "--", SCRIPT, checkpoint, str(out), scenario]
        env = {**os.environ, "TMPDIR": str(out / "tmp")}
        proc = subprocess.run(cmd, stdin=subprocess.PIPE, capture_output=True, text=True, timeout=120, env=env)
        results = []
        for rank in range(ranks):
            file = out / f"rank{rank}.json"
            if file.exists():
                results.append({**json.loads(file.read_text()), "dir": str(out)})
            else:  # a rank that was killed
                results.append({"error": "no result", "message": f"mlx.launch said:\n{proc.stdout}\n{proc.stderr}"})
        return results

    return run
