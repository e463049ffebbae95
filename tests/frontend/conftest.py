import signal

import pytest


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal: a test run started in the
    background inherits SIGINT ignored, and Python then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
