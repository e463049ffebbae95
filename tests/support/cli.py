"""The `metalqwen` command run as a subprocess, as a user runs it."""

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
