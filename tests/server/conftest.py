"""The server tests' live server on their module's `model` (each file loads its own) and the
official `openai` client for it."""

import pytest

from metalqwen.server import create_app

from ..support.require import require
from ..support.server_fixtures import LiveServer


@pytest.fixture(scope="module")
def server(model):
    live = LiveServer(create_app(model, max_queue=4))
    yield live
    live.close()


@pytest.fixture(scope="module")
def client(server):
    openai = require("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
