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

import numpy as np
import pytest

from ..support import model_fixtures as mf
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


@pytest.fixture(scope="session")
def tiny_moe_mtp(ckpt_root):
    """A qwen3_5_moe checkpoint as small (hidden 128, 4 layers, 4 experts top-2, untied, 4-bit group
    32; mlx-lm's conversion) with an MTP head in mtp.safetensors that predicts what the trunk will:
    every residual writer is quiet (the next token depends on the current one), fc passes the
    embedding through, its layer is the trunk's layer 3 and its norm the trunk's final norm."""
    require("mlx_lm")

    def quiet_experts(weights):  # mixer_gain leaves the fused expert projections (no .weight) alone
        for name in weights:
            if name.endswith("experts.down_proj"):
                weights[name] = weights[name] * np.float32(1e-4)

    root = os.path.join(ckpt_root, "pipeline-moe-mtp")
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=128,
               norm_topk_prob=True)
    hf = mf.write_hf_checkpoint(os.path.join(root, "hf"), seed=3, tied=False, mixer_gain=1e-4, edit=quiet_experts,
                                moe=moe, hidden_size=128, intermediate_size=128, linear_num_key_heads=1,
                                linear_num_value_heads=1, full_attention_interval=2)
    folder = mf.convert_to_mlx(hf, os.path.join(root, "mlx"), bits=4, group_size=32)
    write_mtp_head(folder)
    return folder


@pytest.fixture(scope="session")
def loud_mtp(tiny_moe_mtp, ckpt_root):
    """tiny_moe_mtp with its head's attention output 10^6 times louder: its drafts then depend on
    every row of its cache (the quiet head's hardly do)."""
    folder = shutil.copytree(tiny_moe_mtp, os.path.join(ckpt_root, "pipeline-loud-mtp"))
    write_mtp_head(folder, o_proj_gain=1e6)
    return folder


def write_mtp_head(folder: str, o_proj_gain: float = 1.0) -> None:
    """Writes the MTP head of tiny_moe_mtp into folder/mtp.safetensors (``o_proj_gain`` scales its
    attention's output projection)."""
    from metalqwen.checkpoint import load_checkpoint
    from metalqwen.demo_checkpoint import bf16_bits, bf16_to_f32, quantize_affine, write_safetensors

    ck = load_checkpoint(folder)
    hidden, prefix = ck.config.hidden_size, ck.layer_prefix(3)
    head = {"mtp.layers.0." + n[len(prefix):]: (t.dtype, np.array(ck.array(n)))
            for n, t in ck.tensors.items() if n.startswith(prefix)}
    for part in ("scales", "biases"):  # affine: w = q * scale + bias, both scaled
        dtype, bits = head[f"mtp.layers.0.self_attn.o_proj.{part}"]
        head[f"mtp.layers.0.self_attn.o_proj.{part}"] = (dtype, bf16_bits(bf16_to_f32(bits) * np.float32(o_proj_gain)))
    identity = np.concatenate([np.eye(hidden), np.zeros((hidden, hidden))], axis=1).astype(np.float32)
    wq, scales, biases = quantize_affine(identity, 4, 32)
    head.update({"mtp.fc.weight": ("U32", wq), "mtp.fc.scales": ("BF16", scales), "mtp.fc.biases": ("BF16", biases)})
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):  # stored shifted: weight 1
        head[f"mtp.{norm}.weight"] = ("BF16", bf16_bits(np.ones(hidden, np.float32)))
    trunk_norm = "language_model.model.norm.weight"
    head["mtp.norm.weight"] = (ck.tensors[trunk_norm].dtype, np.array(ck.array(trunk_norm)))
    write_safetensors(os.path.join(folder, "mtp.safetensors"), head)


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
