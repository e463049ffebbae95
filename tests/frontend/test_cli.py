"""The `metalqwen` command as a new user meets it: the context limit, errors as one line, Ctrl-C,
chat turns reusing the cache, the demo, --version and help. Run as a subprocess where the test is
about the process (signals, pipes, stdin, a terminal, the environment); else its main() in this
process (`_call`), which prints and returns what the process would."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import metalqwen
from metalqwen import cli

from ..support.cli import call as _call
from ..support.cli import default_sigint as _default_sigint
from ..support.cli import run as _run
from ..support.model_fixtures import read_header
from ..support.require import require

_BENCHES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
TTFT_BENCH = os.path.join(_BENCHES, "server_ttft.py")


class _Session:
    """A CLI subprocess whose output is collected as it comes, to act on it mid-run."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, "-m", "metalqwen.cli", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint)
        self.out, self.err = bytearray(), bytearray()
        self._readers = [threading.Thread(target=self._read, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream, into: bytearray) -> None:
        while chunk := os.read(stream.fileno(), 4096):
            into.extend(chunk)

    def text(self, which: str) -> str:
        return bytes(self.out if which == "out" else self.err).decode("utf-8", "replace")

    def wait_for(self, condition, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"exited early: {self.text('err')}"
            assert time.monotonic() < deadline, f"timed out; stderr: {self.text('err')}"
            time.sleep(0.05)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()

    def _end(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for r in self._readers:
            r.join()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            pipe.close()
        return code

    def interrupt(self) -> None:
        """Sends SIGINT and waits for the process to exit (the timeout only guards against a hang)."""
        self.proc.send_signal(signal.SIGINT)
        self._end(timeout=300)

    def finish(self) -> int:
        self.proc.stdin.close()
        return self._end(timeout=300)


def _one_line_error(result, message: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("metalqwen: ")]
    assert len(lines) == 1 and message in lines[0], result.stderr


# ---------------------------------------------------------------------------- context limit, errors


def test_generate_stops_at_the_context_limit_and_says_so(demo, device, capfd):
    # Seeded: the folder's sampling settings apply, and whether lookup drafts get accepted depends on the tokens.
    out = _call(capfd, "generate", "-m", demo, "--device", device.kind, "-p", "hi", "--max-context", "40",
                "--max-tokens", "100", "--seed", "1")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.strip()
    assert "decode: 28 tokens" in out.stderr and "stopped: context full (max_context 40)" in out.stderr
    assert "dispatches" not in out.stderr, "developer figures need --stats"
    # The speculative line shows by default only when drafts were accepted (a speed-up the user got).
    speculative = [line for line in out.stderr.splitlines() if line.startswith("speculative")]
    assert all("(0 of " not in line for line in speculative), out.stderr


def test_sampling_left_out_comes_from_the_folder_as_in_the_server(demo, device, capfd):
    with open(os.path.join(demo, "generation_config.json")) as f:
        qwen = json.load(f)  # the demo ships Qwen's recommended settings
    common = ["generate", "-m", demo, "--device", device.kind, "--raw", "-p", "Once", "--max-tokens", "8", "--seed", "3"]
    folder = _call(capfd, *common)
    explicit = _call(capfd, *common, "--temperature", str(qwen["temperature"]), "--top-k", str(qwen["top_k"]),
                     "--top-p", str(qwen["top_p"]))
    greedy = _call(capfd, *common, "--temperature", "0")
    assert folder.returncode == explicit.returncode == greedy.returncode == 0, folder.stderr
    assert folder.stdout == explicit.stdout != greedy.stdout
    assert "the folder's generation_config.json" in _call(capfd, "generate", "--help").stdout


def test_stats_adds_the_engine_counters_and_the_stop_reason_is_said(demo, device, capfd):
    out = _call(capfd, "generate", "-m", demo, "--device", device.kind, "-p", "hi", "--max-tokens", "3", "-v")
    assert out.returncode == 0, out.stderr
    assert "decode: 3 tokens" in out.stderr and "stopped: max tokens" in out.stderr
    assert "dispatches" in out.stderr and "barriers per step" in out.stderr and "MB of weights per token" in out.stderr
    assert "speculative (lookup): " in out.stderr, "with --stats even when speculation did nothing"


@pytest.mark.parametrize("args, message", [
    (["-p", "word " * 30, "--max-context", "40"], "the prompt does not fit: 101 tokens"),
    (["-p", "hi", "--temperature", "-1"], "temperature must be >= 0"),
    (["-p", "hi", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["-p", "hi", "--repetition-penalty", "0"], "repetition_penalty must be > 0"),
    (["-p", "hi", "--max-context", "1"], "max_context must be an integer >= 2, got 1"),
    (["-p", "hi", "--max-tokens", "0"], "--max-tokens must be an integer >= 1, got 0"),
])
def test_errors_are_one_line_and_exit_1(demo, device, args, message, capfd):
    _one_line_error(_call(capfd, "generate", "-m", demo, "--device", device.kind, *args), message)


def test_a_file_as_the_model_folder_is_one_line(demo, capfd):
    _one_line_error(_call(capfd, "generate", "-m", os.path.join(demo, "config.json"), "-p", "hi"), "is a file")


# ---------------------------------------------------------------------------- Ctrl-C


@pytest.mark.parametrize("command", ["generate", "demo"])
def test_ctrl_c_while_decoding_exits_130_without_a_traceback(demo, device, command, tmp_path):
    # The prompt "a" decodes hundreds of tokens on the demo checkpoint before an eos.
    model = ["-m", demo] if command == "generate" else ["--keep", str(tmp_path / "demo")]
    greedy = ["--temperature", "0"] if command == "generate" else []  # demo decodes greedily
    s = _Session(command, *model, "--device", device.kind, "-p", "a", "--max-tokens", "400", *greedy)
    s.wait_for(lambda: len(s.text("out").strip()) > 30)
    s.interrupt()
    assert s.proc.returncode == 130, s.text("err")
    assert "Traceback" not in s.text("err") and "metalqwen: interrupted" in s.text("err")


def test_ctrl_c_during_a_long_prefill_stops_it_between_chunks(demo, device):
    s = _Session("generate", "-m", demo, "--device", device.kind, "--raw", "--progress", "--max-context", "2048",
                 "-p", "word " * 400)
    s.wait_for(lambda: "prompt [" in s.text("err"))  # progress shows once a prefill passes one second
    s.interrupt()
    err = s.text("err")
    assert s.proc.returncode == 130 and "Traceback" not in err and "metalqwen: interrupted" in err
    # Acknowledged while the chunk still runs (a chunk can take seconds), before the stop itself.
    assert -1 < err.find("stopping after this chunk...") < err.find("metalqwen: interrupted"), err
    done, total = err.rsplit(" tokens", 1)[0].rsplit(" ", 1)[1].split("/")
    assert int(done) < int(total) == 1201


def test_ctrl_c_in_chat_stops_the_answer_and_the_next_turn_reuses_the_cache(demo, device):
    s = _Session("chat", "-m", demo, "--device", device.kind, "--max-tokens", "400", "--temperature", "0")
    s.send("a\n")
    s.wait_for(lambda: len(s.text("out").strip()) > 30)
    s.proc.send_signal(signal.SIGINT)
    s.wait_for(lambda: "(answer stopped)" in s.text("err"))
    s.send("more\n")
    assert s.finish() == 0, s.text("err")
    err = s.text("err")
    assert "Traceback" not in err
    reports = [line for line in err.splitlines() if line.startswith("prompt: ")]
    assert len(reports) == 2 and "reused)" in reports[1], err


# ---------------------------------------------------------------------------- chat


def test_chat_turns_reuse_the_cache_refuse_empty_messages_and_end_on_ctrl_d(demo, device):
    out = _run("chat", "-m", demo, "--device", device.kind, "--max-tokens", "6", stdin="hi\n\nmore\na third\n")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    reports = [line for line in out.stderr.splitlines() if line.startswith("prompt: ")]
    assert len(reports) == 3 and "reused" not in reports[0]
    reused = [int(report.split("(")[1].split()[0]) for report in reports[1:]]
    for previous, count in zip(reports, reused):
        # The template drops the last answer's thinking: the prefix cache resumes at the end of
        # the previous user turn, inside the previous prompt (before its generation prompt).
        assert 0 < count < int(previous.split()[1])
    assert reused[0] < reused[1]
    assert "(empty message" in out.stderr
    assert out.stdout.endswith("> \n"), "Ctrl-D ends the prompt line"


def test_chat_commands_and_a_multi_line_message(demo, device):
    stdin = ('/help\n/nonsense\n"""\nfirst line\nsecond line\n"""\nhi\n/clear\nhi\n/system be brief\nhi\n'
             '/exit\nnever read\n')
    out = _run("chat", "-m", demo, "--device", device.kind, "--max-tokens", "3", stdin=stdin)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "/system TEXT" in out.stderr and "(unknown command /nonsense" in out.stderr
    reports = [line for line in out.stderr.splitlines() if line.startswith("prompt: ")]
    sizes = [int(r.split()[1]) for r in reports]
    assert len(reports) == 4, "the three-line block is one message, /exit stops before 'never read'"
    assert "reused" in reports[1] and "reused" not in reports[2], "/clear starts afresh"
    assert sizes[2] < sizes[0], "the block's two lines were one message"
    assert sizes[3] > sizes[2] and "reused" not in reports[3], "/system adds a system message to a fresh start"


def test_the_chat_terminal_edits_lines_keeps_history_and_takes_a_pasted_block_as_one_message(demo, device, tmp_path):
    import shutil

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    session, sock = f"mq{os.getpid()}", str(tmp_path / "tmux.sock")
    tmux = lambda *a: subprocess.run(["tmux", "-S", sock, *a], capture_output=True, text=True, check=True)  # noqa: E731
    screen = lambda: tmux("capture-pane", "-p", "-J", "-S", "-100", "-t", session).stdout  # noqa: E731
    command = " ".join([sys.executable, "-m", "metalqwen.cli", "chat", "-m", demo, "--device", device.kind,
                        "--max-tokens", "3"])
    tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "50")
    tmux("set-option", "-t", session, "remain-on-exit", "on")  # the screen stays readable after the exit
    tmux("respawn-pane", "-k", "-t", session, f"PYTHONPATH={os.pathsep.join(sys.path)} {command}")
    def wait(condition) -> bool:
        deadline = time.monotonic() + 300
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.1)
        return condition()

    try:
        assert wait(lambda: "\n> " in screen()), screen()
        (tmp_path / "paste.txt").write_text("first pasted line\nsecond pasted line\n")
        tmux("load-buffer", str(tmp_path / "paste.txt"))
        tmux("paste-buffer", "-p", "-t", session)  # bracketed, as a terminal pastes
        tmux("send-keys", "-t", session, "Enter")
        assert wait(lambda: "prompt: " in screen()), screen()
        # Line editing (readline): "ello", Ctrl-A to the line's start, "h" makes "hello"; then Up
        # recalls it from the history. A plain terminal would show "ello^Ah" and "^[[A" instead.
        tmux("send-keys", "-t", session, "ello", "C-a", "h", "Enter")
        assert wait(lambda: screen().count("prompt: ") == 2), screen()
        tmux("send-keys", "-t", session, "Up")
        assert wait(lambda: screen().rstrip().splitlines()[-1] == "> hello"), screen()
        tmux("send-keys", "-t", session, "C-u", "/exit", "Enter")
        assert wait(lambda: tmux("display", "-p", "-t", session, "#{pane_dead}").stdout.strip() == "1"), screen()
        reports = [line for line in screen().splitlines() if line.startswith("prompt: ")]
        assert len(reports) == 2, screen()
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True)


def test_chat_offers_a_fresh_context_when_full(demo, device):
    out = _run("chat", "-m", demo, "--device", device.kind, "--max-tokens", "20", "--max-context", "64",
               stdin="hi\n" + "a long message " * 3 + "\ny\n" + "another long message " * 3 + "\nn\n")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.count("the context is full") == 2
    assert "(fresh context: 0 earlier turns kept)" in out.stderr and "(message dropped" in out.stderr
    assert len([line for line in out.stderr.splitlines() if line.startswith("prompt: ")]) == 2


# ---------------------------------------------------------------------------- small things


def test_version_and_help_for_every_option(capfd):
    out = _call(capfd, "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"metalqwen {metalqwen.__version__}"
    commands = next(a for a in cli.parser()._actions if a.dest == "command")
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.help, f"metalqwen {name} {action.option_strings} has no help text"


def test_python_dash_m_metalqwen_is_the_command():
    out = subprocess.run([sys.executable, "-m", "metalqwen", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"metalqwen {metalqwen.__version__}", out.stderr


def test_the_prompt_from_stdin_or_a_file_is_the_prompt_given_inline(demo, device, tmp_path, capfd):
    prompt = "Why is the sky blue?\nAnswer in one line."  # a newline, as pasted text has
    common = ["generate", "-m", demo, "--device", device.kind, "--raw", "--max-tokens", "4", "--temperature", "0"]
    inline = _call(capfd, *common, "-p", prompt)
    assert inline.returncode == 0 and inline.stdout.strip(), inline.stderr
    piped = _run(*common, "-p", "-", stdin=prompt)  # a process: its standard input
    (tmp_path / "prompt.txt").write_text(prompt, encoding="utf-8")
    from_file = _call(capfd, *common, "--prompt-file", str(tmp_path / "prompt.txt"))
    assert piped.stdout == inline.stdout == from_file.stdout, (piped.stderr, from_file.stderr)
    both = _call(capfd, *common, "-p", "hi", "--prompt-file", str(tmp_path / "prompt.txt"))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_structured_output_from_a_schema_or_a_grammar_file(demo, device, tmp_path, capfd):
    common = ["generate", "-m", demo, "--device", device.kind, "--raw", "-p", "Is it?", "--max-tokens", "8"]
    (tmp_path / "answer.schema.json").write_text('{"enum": ["yes", "no"]}')
    (tmp_path / "answer.gbnf").write_text('root ::= "maybe" | "never"')
    inline = _call(capfd, *common, "--json-schema", '{"enum": ["yes", "no"]}')
    from_file = _call(capfd, *common, "--json-schema-file", str(tmp_path / "answer.schema.json"))
    assert inline.returncode == from_file.returncode == 0, (inline.stderr, from_file.stderr)
    assert json.loads(inline.stdout) in ("yes", "no") and from_file.stdout == inline.stdout
    grammar = _call(capfd, *common, "--grammar-file", str(tmp_path / "answer.gbnf"))
    assert grammar.returncode == 0 and grammar.stdout.strip() in ("maybe", "never"), grammar.stderr
    assert "stopped: end of answer" in grammar.stderr
    _one_line_error(_call(capfd, *common, "--json-schema", "{oops"), "--json-schema: not JSON")
    _one_line_error(_call(capfd, *common, "--grammar-file", str(tmp_path / "missing.lark")), "missing.lark")
    both = _call(capfd, *common, "--json-schema", "{}", "--grammar-file", str(tmp_path / "answer.gbnf"))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_a_reader_that_goes_away_ends_generate_quietly(demo, device):
    with subprocess.Popen([sys.executable, "-m", "metalqwen.cli", "generate", "-m", demo, "--device", device.kind,
                           "-p", "a", "--max-tokens", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout.read(8)  # like `| head -c 8`: read a little, then close the pipe
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 0, err
    assert "Broken pipe" not in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_demo_hf_writes_an_original_that_converts_and_drafts_with_its_mtp_head(device, tmp_path, capfd):
    hf, mlx = tmp_path / "original", tmp_path / "original-mlx"
    out = _call(capfd, "demo", "--hf", str(hf))
    assert out.returncode == 0 and f"metalqwen convert {hf} {mlx}" in out.stderr, out.stderr
    assert any(name.startswith("mtp.") for name in read_header(hf / "model.safetensors"))
    assert _call(capfd, "convert", str(hf), str(mlx)).returncode == 0
    spec = _call(capfd, "generate", "-m", str(mlx), "--device", device.kind, "--speculative", "mtp", "-p", "Hi",
                 "--max-tokens", "6", "--temperature", "0", "--max-context", "128", "--stats")
    assert spec.returncode == 0 and "speculative (mtp): " in spec.stderr, spec.stderr
    plain = _call(capfd, "generate", "-m", str(mlx), "--device", device.kind, "--speculative", "off", "-p", "Hi",
                  "--max-tokens", "6", "--temperature", "0", "--max-context", "128")
    assert plain.stdout == spec.stdout


def test_demo_prints_its_prompt_stops_soon_and_removes_its_checkpoint(device, tmp_path, capfd):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = _run("demo", "--device", device.kind, "--max-tokens", "4", env={"TMPDIR": str(tmp)})  # a process: its TMPDIR
    assert out.returncode == 0, out.stderr
    assert "> Hello! Who are you?" in out.stdout and "tok/s" in out.stderr
    assert list(tmp.iterdir()) == []
    out = _call(capfd, "demo", "--device", device.kind, "--keep", str(tmp_path / "kept"))
    assert out.returncode == 0 and (tmp_path / "kept" / "config.json").is_file()
    # Random weights ramble until max_tokens: the default stops them within a few seconds.
    decoded = int(out.stderr.split("decode: ")[1].split()[0])
    assert decoded <= 32 and "stopped: max tokens" in out.stderr, out.stderr


def _bench(run, demo, device, tmp_path, *args):
    """`metalqwen bench --quick --json FILE` on the demo checkpoint, by ``run`` (a process, or
    main() here): (its result, the JSON)."""
    path = tmp_path / "bench.json"
    out = run("bench", "-m", demo, "--device", device.kind, "--quick", "--json", str(path), *args)
    assert out.returncode == 0, out.stderr
    return out, json.loads(path.read_text())


def _assert_figures(figures: dict, prefill: list, contexts: list, tokens: int) -> None:
    assert [r["tokens"] for r in figures["prefill"]] == prefill
    assert all(r["tokens_per_second"] > 0 and r["ttft_seconds"] > 0 for r in figures["prefill"])
    assert [(r["context"], r["tokens"]) for r in figures["decode"]] == [(c, tokens) for c in contexts]
    assert all(r["tokens_per_second"] > 0 for r in figures["decode"])  # speed itself is not asserted
    assert figures["load_seconds"] > 0


def test_bench_quick_writes_every_figure_and_the_concurrency_levels(demo, device, tmp_path, capfd):
    out, data = _bench(lambda *a: _call(capfd, *a), demo, device, tmp_path, "--concurrency", "1,2")
    assert data["model"] == demo and data["device"] == device.kind and data["kv_bits"] == 8
    assert data["notes"] == [] and data["mlx_lm"] is None and data["ratios"] is None
    ours = data["metalqwen"]
    _assert_figures(ours, [32, 64], [0, 64], 8)
    assert ours["memory_bytes"] > 0 and ours["speculative"] is None  # plain decoding unless asked
    assert ours["engine"]["dispatches_last_step"] > ours["engine"]["barriers_last_step"] > 0
    assert "prefill 64 tok/s" in out.stdout and "decode at context 64 tok/s" in out.stdout
    assert "say nothing about an Apple GPU" in out.stdout or device.kind != "cpu"
    assert "metalqwen: prefill 32 tokens" in out.stderr and "metalqwen: metalqwen:" not in out.stderr
    assert "\r" not in out.stderr and "\033[K" not in out.stderr, "not a terminal: plain lines"

    assert data["concurrency"] == dict(levels=[1, 2], prompt_tokens=32, tokens_per_stream=8, max_sequences=2)
    one, two = ours["concurrency"]
    assert (one["concurrency"], one["tokens"], two["concurrency"], two["tokens"]) == (1, 8, 2, 16)
    assert one["steps"] == 8  # alone: a decode step per token (the first token comes from the prefill)
    # Together: one step serves both streams, save the first stream's first step (alone) and the
    # second stream's last (it joined a step later, its prompt a chunk of the first stream's step).
    assert two["steps"] <= two["tokens"] // 2 + 2 < two["tokens"]
    # Pipelined: each step committed while the one before runs, save the first, the one that
    # carries the second prompt's chunk (a host decision: it waited for the steps in flight) and
    # the one after it.
    assert one["pipelined_steps"] == one["steps"] - 1 and two["pipelined_steps"] == two["steps"] - 3
    for r in (one, two):
        assert r["seconds"] > 0 and r["prefill_seconds"] > 0 and r["speculative"] is None
        assert r["tokens_per_second"] == pytest.approx(r["tokens"] / r["seconds"])
        assert r["per_stream_tokens_per_second"] == pytest.approx(r["tokens_per_second"] / r["concurrency"])
    assert one["speedup"] == 1 and two["speedup"] == pytest.approx(two["tokens_per_second"] / one["tokens_per_second"])
    assert "aggregate decode, 2 streams tok/s" in out.stdout
    assert f"c=2: {two['tokens_per_second']:10.2f} tok/s aggregate" in out.stdout
    assert "16 tokens" in out.stdout and "metalqwen: 2 prompts of 32 tokens" in out.stderr
    assert f"{two['steps']} decode steps for 16 tokens ({two['pipelined_steps']} pipelined)" in out.stdout


def test_bench_clamps_the_concurrency_prompts_to_max_context():
    from metalqwen import bench

    p = bench.plan(True, 4, 30, bench.concurrency_levels("2"))
    assert (p.concurrency, p.concurrency_prompt) == ([1, 2], 25)
    assert p.notes[-1] == "concurrency prompts of 32 tokens clamped to 25 (max_context 30 - 4 decoded tokens)"


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "0,2"], "--concurrency must be comma-separated integers in 1..8"),
    (["--concurrency", "2,x"], "--concurrency must be comma-separated integers in 1..8"),
    (["--concurrency", "9"], "--concurrency must be comma-separated integers in 1..8"),
    (["--concurrency", "1,4", "--max-sequences", "2"], "--max-sequences 2 is less than the largest --concurrency"),
    (["--max-sequences", "0"], "--max-sequences must be an integer in 1..8"),
])
def test_bench_refuses_bad_concurrency_in_one_line(demo, device, args, message, capfd):
    _one_line_error(_call(capfd, "bench", "-m", demo, "--device", device.kind, "--quick", *args), message)


def test_serve_passes_max_sequences_to_the_load(monkeypatch):
    loads = []
    monkeypatch.setattr("metalqwen.loading.load", lambda *args, **kwargs: loads.append(kwargs["max_sequences"]))
    for argv in (["serve", "-m", "x"], ["serve", "-m", "x", "--max-sequences", "1"],
                 ["generate", "-m", "x", "-p", "hi"]):
        cli._load(cli.parser().parse_args(argv))
    assert loads == [4, 1, 1]  # serve: 4 unless told; generate and chat: one sequence


def test_distributed_commands_take_the_single_machine_defaults(monkeypatch):
    loads = []
    monkeypatch.setattr("metalqwen.loading.load", lambda *args, **kwargs: loads.append(kwargs))
    for argv in (["serve", "-m", "x"], ["chat", "-m", "x"], ["serve", "-m", "x", "--distributed", "pipeline"],
                 ["chat", "-m", "x", "--distributed", "pipeline", "--distributed-timeout", "5"]):
        cli._load(cli.parser().parse_args(argv))
    got = [(k["prefix_cache_bytes"] / 2**30, k["max_sequences"], k["speculative"], k["distributed_timeout"])
           for k in loads]
    assert got == [(2, 4, "auto", 60), (1, 1, "auto", 60), (2, 4, "auto", 60), (1, 1, "auto", 5)]


def test_serve_on_a_busy_port_fails_in_one_line_before_loading(tmp_path, capfd):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        # The folder does not exist: only a check made before the load can give this error.
        out = _call(capfd, "serve", "-m", str(tmp_path / "absent"), "--port", str(port))
    _one_line_error(out, f"cannot listen on 127.0.0.1:{port}: Address already in use")


@pytest.mark.parametrize("value", ["0", "9"])
def test_serve_refuses_max_sequences_outside_1_to_8_before_loading(demo, value, capfd):
    _one_line_error(_call(capfd, "serve", "-m", demo, "--max-sequences", value),
                    "--max-sequences must be an integer in 1..8")


@pytest.mark.parametrize("args, message", [
    (["--max-images", "0"], "--max-images must be positive, got 0"),
    (["--fetch-timeout", "-1"], "--fetch-timeout must be positive, got -1.0"),
    (["--allowed-image-dir", "/absent/dir"], "--allowed-image-dir /absent/dir is not a directory"),
])
def test_serve_checks_its_image_options_before_loading(tmp_path, args, message, capfd):
    # The folder does not exist: only a check made before the load can give this error.
    _one_line_error(_call(capfd, "serve", "-m", str(tmp_path / "absent"), *args), message)


def test_bench_compares_with_mlx_lm_side_by_side(demo, device, tmp_path):
    require("mlx_lm")
    # A process: mlx-lm's model and threads stay out of the test worker.
    out, data = _bench(_run, demo, device, tmp_path, "--compare", "mlx-lm", "--concurrency", "2")
    _assert_figures(data["mlx_lm"], [32, 64], [0, 64], 8)
    assert set(data["ratios"]) == {"prefill 32 tok/s", "prefill 64 tok/s", "time to first token at 32, s",
                                   "time to first token at 64, s", "decode at context 0 tok/s",
                                   "decode at context 64 tok/s", "aggregate decode, 1 stream tok/s",
                                   "aggregate decode, 2 streams tok/s"}
    # mlx-lm's BatchGenerator: its first step makes each stream's first token, so 9 per stream.
    assert [(r["concurrency"], r["tokens"]) for r in data["mlx_lm"]["concurrency"]] == [(1, 9), (2, 18)]
    assert data["mlx_lm"]["concurrency"][1]["steps"] < 18 and "mlx-lm     c=2:" in out.stdout
    assert all(r > 0 for r in data["ratios"].values())
    header = next(line for line in out.stdout.splitlines() if "metalqwen" in line and "mlx-lm" in line)
    assert "ratio" in header and "mlx-lm: loading" in out.stderr


def test_bench_without_mlx_lm_says_it_skipped_it_and_clamps_the_sizes(demo, device, tmp_path):
    # A module set to None in sys.modules fails to import, as if it were not installed.
    script = ("import sys; sys.modules['mlx_lm'] = None; from metalqwen.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    path = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "-c", script, "bench", "-m", demo, "--device", device.kind, "--quick",
                          "--compare", "mlx-lm", "--json", str(path), "--max-context", "40", "--decode-tokens", "4"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "mlx-lm: skipped: mlx-lm is not installed" in out.stdout
    assert out.stderr.startswith("mlx-lm: will be skipped: mlx-lm is not installed"), "said before metalqwen runs"
    data = json.loads(path.read_text())
    assert data["mlx_lm_skipped"].startswith("mlx-lm is not installed")
    # The sizes are clamped to max_context, and the output says so.
    _assert_figures(data["metalqwen"], [32, 39], [0, 35], 4)
    assert data["max_context"] == 40 and len(data["notes"]) == 2
    assert "clamped to [32, 39]" in out.stdout and "clamped to [0, 35]" in out.stdout


def test_bench_plot_draws_or_says_matplotlib_is_missing(demo, device, tmp_path, capfd):
    png = tmp_path / "speed.png"
    out = _call(capfd, "bench", "-m", demo, "--device", device.kind, "--quick", "--plot", str(png))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # Refused before anything runs, in one line.
        _one_line_error(out, "--plot needs matplotlib")
        assert not png.exists()
        return
    assert out.returncode == 0, out.stderr
    assert png.read_bytes().startswith(b"\x89PNG")


def test_the_ttft_bench_hits_the_prefix_cache_on_the_demo_checkpoint(demo, device):
    out = _run("-m", demo, "--device", device.kind, "--prefix-tokens", "24", "--max-tokens", "1", script=TTFT_BENCH)
    assert out.returncode == 0, out.stderr
    cold, hit = (line for line in out.stdout.splitlines() if line.startswith(("cold:", "hit:")))
    assert "cached tokens 0" in cold and "cached tokens 0" not in hit  # speed is not asserted
    assert "speed-up from the prefix cache" in out.stdout


def test_thinking_can_be_turned_off_or_hidden(demo, device, capfd):
    common = ["generate", "-m", demo, "--device", device.kind, "-p", "hi", "--max-tokens", "6", "--temperature", "0"]
    prompt_tokens = lambda out: int(out.stderr.split("prompt: ")[1].split()[0])  # noqa: E731
    thinking, no_think = _call(capfd, *common), _call(capfd, *common, "--no-think")
    as_kwargs = _call(capfd, *common, "--chat-template-kwargs", '{"enable_thinking": false}')
    assert thinking.returncode == no_think.returncode == as_kwargs.returncode == 0, thinking.stderr
    assert prompt_tokens(no_think) == prompt_tokens(as_kwargs) > prompt_tokens(thinking)
    # Off a terminal the text is printed as generated; --hide-thinking keeps only the answer.
    hidden = _call(capfd, *common, "--hide-thinking")
    assert hidden.returncode == 0 and thinking.stdout.strip()
    assert hidden.stdout.strip() in thinking.stdout and len(hidden.stdout) < len(thinking.stdout)
    bad = _call(capfd, *common, "--chat-template-kwargs", "[1]")
    assert bad.returncode == 2 and "must be a JSON object" in bad.stderr


def test_chat_turns_thinking_off_or_hides_it_as_generate_does(demo, device, capfd, monkeypatch):
    def run(command, *flags):
        monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))  # chat's one message (generate reads -p)
        out = _call(capfd, command, "-m", demo, "--device", device.kind, "--max-tokens", "6", "--temperature", "0",
                    *(["-p", "hi"] if command == "generate" else []), *flags)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        return out

    prompt_tokens = lambda out: int(out.stderr.split("prompt: ")[1].split()[0])  # noqa: E731
    thinking, no_think, hidden = run("chat"), run("chat", "--no-think"), run("chat", "--hide-thinking")
    assert prompt_tokens(no_think) == prompt_tokens(run("generate", "--no-think")) > prompt_tokens(thinking)
    as_kwargs = run("chat", "--chat-template-kwargs", '{"enable_thinking": false}')
    assert prompt_tokens(as_kwargs) == prompt_tokens(no_think)
    # "> " prompts around the answer; hidden, the answer keeps only what follows the thinking.
    answer = lambda out: out.stdout.removeprefix("> ").removesuffix("> \n")  # noqa: E731
    assert answer(thinking).strip() and answer(hidden).strip() in answer(thinking)
    assert len(answer(hidden)) < len(answer(thinking))


def test_on_a_terminal_the_thinking_is_dimmed_apart_from_the_answer(capsys):
    shown = cli._AnswerPrinter(opens_thinking=True, hide_thinking=False, terminal=True)
    for piece in ("Let me th", "ink.</th", "ink>\n\nThe answer."):
        shown.feed(piece)
    shown.finish()
    assert capsys.readouterr().out == "\033[2mLet me th\033[0m\033[2mink.\033[0m\n\nThe answer.\n"
    hidden = cli._AnswerPrinter(opens_thinking=True, hide_thinking=True, terminal=True)
    for piece in ("Let me think.</think>", "\n\nThe answer."):
        hidden.feed(piece)
    hidden.finish()
    assert capsys.readouterr().out == "The answer.\n"


def test_generate_resumes_from_its_cache_dir_after_a_restart(demo, device, tmp_path):
    common = ["generate", "-m", demo, "--device", device.kind, "-p", "tell me a long story " * 6, "--max-tokens", "8",
              "--temperature", "0", "--cache-dir", str(tmp_path / "cache"), "--stats"]
    first, second = _run(*common), _run(*common)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "disk cache: 0 hits, 2 files written" in first.stderr  # the user message's end, the prompt's end
    assert "reused)" in second.stderr and "disk cache: 1 hits, 0 files written" in second.stderr
    assert second.stdout == first.stdout
