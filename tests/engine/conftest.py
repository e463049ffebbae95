"""The engine tests' models, loaded once per run (per xdist worker) and shared by their files."""

import pytest

import metalqwen

_models: dict = {}


@pytest.fixture(scope="session")
def model(device):
    """model(path, kv_bits=16, prefill_chunk=64): loaded once per (device, checkpoint, options)."""

    def get(path: str, kv_bits: int = 16, prefill_chunk: int = 64) -> metalqwen.Model:
        key = (device.kind, path, kv_bits, prefill_chunk)
        if key not in _models:
            _models[key] = metalqwen.load(path, device=device, max_context=160, kv_bits=kv_bits,
                                          prefill_chunk=prefill_chunk, progress=False)
        return _models[key]

    return get
