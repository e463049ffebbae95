"""Exceptions raised by metalqwen (the native core raises these too)."""


class GpuError(RuntimeError):
    """A GPU (or CPU runtime) failure; the message names the component and the kernel."""


class CompileError(GpuError):
    """MSL that did not compile; ``diagnostics`` holds the compiler's own output."""

    def __init__(self, message: str, diagnostics: str = ""):
        super().__init__(f"{message}\n{diagnostics}" if diagnostics else message)
        self.diagnostics = diagnostics
