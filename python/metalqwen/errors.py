"""Exceptions raised by metalqwen (the native core raises these too).

Every error metalqwen raises on purpose is a ``MetalqwenError``; each class also derives
from the builtin a caller would expect (ValueError for bad input, RuntimeError for
failures at run time), so ``except ValueError`` keeps working."""


class MetalqwenError(Exception):
    """Base of every metalqwen error; the CLI prints these as one line."""


class GpuError(MetalqwenError, RuntimeError):
    """A GPU (or CPU runtime) failure; the message names the component and the kernel."""


class CompileError(GpuError):
    """MSL that did not compile; ``diagnostics`` holds the compiler's own output."""

    def __init__(self, message: str, diagnostics: str = ""):
        super().__init__(f"{message}\n{diagnostics}" if diagnostics else message)
        self.diagnostics = diagnostics


class EngineError(MetalqwenError, RuntimeError):
    """The engine refused a call or failed during one; its state stays usable."""


class ContextFullError(EngineError, ValueError):
    """The tokens asked for do not fit in ``max_context`` (the cache is sized for it)."""


class DistributedError(MetalqwenError, RuntimeError):
    """A rank of a distributed run died, hung, could not be reached or disagreed with the others
    (the model, the metalqwen version, a call's arguments); the message names the rank."""
