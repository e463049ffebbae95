"""`metalqwen serve`: an OpenAI-compatible HTTP server around one loaded model."""

from .app import create_app

__all__ = ["create_app"]
