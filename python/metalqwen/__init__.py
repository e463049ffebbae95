"""metalqwen: Qwen3.5-family hybrid models on Apple GPUs (Metal), with a CPU runtime for other machines.

    model = metalqwen.load("path/to/Qwen3.5-...-4bit")
    print(model.generate("Hello", chat=True).text)
"""

from . import gpu
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .config import ConfigError, ModelConfig
from .conversation import Conversation
from .errors import CompileError, ContextFullError, DistributedError, EngineError, GpuError, MetalqwenError
from .loading import load
from .model import Chunk, Generation, GenerationStats, Model
from .tokenizer import Tokenizer, TokenizerError

__all__ = [
    "load", "Model", "Generation", "GenerationStats", "Chunk", "Conversation", "gpu", "MetalqwenError", "GpuError",
    "CompileError", "EngineError", "ContextFullError", "DistributedError",
    "load_checkpoint", "Checkpoint", "CheckpointError", "ConfigError", "ModelConfig", "Tokenizer", "TokenizerError",
]
__version__ = "0.1.0"
