"""The `metalqwen` command run as a subprocess, as a user runs it, or its main() in this process
where a test is about what the command prints and returns rather than about the process."""

import os
import signal
import subprocess
import sys


def default_sigint():
    # A child started from a background job inherits SIGINT ignored; Python would then not
    # install its handler and Ctrl-C could not be tested.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(*args, stdin=None, env=None, script=None):
    command = [sys.executable, script] if script else [sys.executable, "-m", "metalqwen.cli"]
    return subprocess.run([*command, *args], input=stdin, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, preexec_fn=default_sigint)


def call(capfd, *args) -> subprocess.CompletedProcess:
    """`metalqwen ARGS` as `cli.main(ARGS)` here, its output taken by pytest's ``capfd`` (file
    descriptors too): the exit code and text `run` gives, without a new interpreter and model load.
    An exception main() lets through fails the test, as a traceback on stderr would."""
    from metalqwen import cli

    capfd.readouterr()  # drop what the test printed before
    try:
        code = cli.main(list(args))
    except SystemExit as e:  # argparse: --help, --version (0) and usage errors (2)
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    out = capfd.readouterr()
    return subprocess.CompletedProcess(["metalqwen", *args], code, out.out, out.err)
