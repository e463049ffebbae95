"""Reference packages (mlx, mlx-lm, transformers): CI must have them, elsewhere a test skips."""

import importlib
import os

import pytest


def require(module: str):
    """Imports a reference package (mlx, mlx-lm, transformers): CI must have it, elsewhere skip."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is missing: the test extras install it (pip install '.[test]')")
        pytest.skip(f"needs {module} (pip install '.[test]')")
