"""metalqwen: Qwen3.5-family hybrid models on Apple GPUs (Metal), with a CPU runtime for other machines."""

from . import gpu
from .errors import CompileError, GpuError

__all__ = ["gpu", "GpuError", "CompileError"]
__version__ = "0.1.0"
