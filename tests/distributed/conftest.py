"""Launching ranks with mlx.launch (ring backend on loopback) and reading their results.

mlx.launch exits 0 whatever its ranks do, and its default ports (32323 + rank) collide when two
launches run at once: each launch gets free ports, an open stdin pipe, its own TMPDIR (each
rank leaves a pidfile and hostfile there), and each rank writes its result to a file."""

import contextlib
import json
import os
import signal
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


class Launch:
    """One mlx.launch of rank_script.py running ``scenario`` (its ranks' results once it ends)."""

    def __init__(self, out, checkpoint: str, scenario: str, ranks: int, extra: list[str]):
        launcher = shutil.which("mlx.launch")
        if launcher is None:
            pytest.fail("mlx.launch is not on PATH (pip install mlx[cpu])")
        (out / "tmp").mkdir(parents=True)
        self.out, self.ranks = out, ranks
        cmd = [launcher, "-n", str(ranks), "--backend", "ring", "--starting-port", str(free_ports(ranks)),
               "--python", sys.executable, "--", SCRIPT, checkpoint, str(out), scenario, *extra]
        env = {**os.environ, "TMPDIR": str(out / "tmp")}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)

    def results(self, stdin: str = "", timeout: float = 120) -> list[dict]:
        """Waits for the ranks (``stdin``: what mlx.launch gives every rank) -> each rank's result
        dict (a rank that wrote none: {"error": "no result", "message": what mlx.launch printed})."""
        try:
            stdout, stderr = self.proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            stdout, stderr = self.proc.communicate()
        results = []
        for rank in range(self.ranks):
            file = self.out / f"rank{rank}.json"
            if file.exists():
                results.append({**json.loads(file.read_text()), "dir": str(self.out)})
            else:  # a rank that was killed
                results.append({"error": "no result", "message": f"mlx.launch said:\n{stdout}\n{stderr}"})
        return results


@pytest.fixture
def start(tmp_path):
    """start(checkpoint, scenario, ranks=2, extra=[]) -> a running Launch (rank_script.py
    CHECKPOINT OUT SCENARIO *extra); killed at the end of the test if still running."""
    require("mlx")
    launches = []

    def run(checkpoint: str, scenario: str, ranks: int = 2, extra: list[str] = ()) -> Launch:
        launches.append(Launch(tmp_path / f"{scenario}{len(launches)}", checkpoint, scenario, ranks, list(extra)))
        return launches[-1]

    yield run
    for launch in launches:
        if launch.proc.poll() is None:  # its ranks too: mlx.launch killed leaves them running
            for pidfile in launch.out.glob("rank*.pid"):
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pidfile.read_text()), signal.SIGKILL)
            launch.proc.kill()
            launch.proc.communicate()


@pytest.fixture
def launch(start):
    """launch(checkpoint, scenario, ranks=2, stdin="") -> [each rank's result dict] (rank_script.py;
    see Launch.results)."""

    def run(checkpoint: str, scenario: str, ranks: int = 2, stdin: str = "") -> list[dict]:
        return start(checkpoint, scenario, ranks).results(stdin)

    return run
