"""What the tests share: tiny checkpoints, numpy references, a live server, the CLI runner."""
