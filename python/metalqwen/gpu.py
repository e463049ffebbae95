"""The low-level GPU API: compile MSL, make buffers, dispatch kernels.

``Device()`` is Metal where available, else the CPU runtime that runs the same MSL
on the CPU; ``Device("cpu")`` forces the CPU runtime. On Apple silicon ``Device()``
never falls back silently: if Metal cannot be opened it raises GpuError saying why.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

import numpy as np

from . import _core
from .errors import CompileError, GpuError

__all__ = ["Device", "Buffer", "Library", "Kernel", "CommandBuffer", "GpuError", "CompileError", "available_kinds",
           "metal_unavailable_reason", "check_msl"]

MAX_ARGUMENT_INDEX = 30  # Metal's argument table has 31 slots


def available_kinds() -> list[str]:
    """Device kinds this build and machine offer, best first."""
    return list(_core.available_device_kinds())


def metal_unavailable_reason() -> str | None:
    """Why Metal cannot be used on this machine and build, or None when it can."""
    return _core.metal_unavailable_reason() or None


def check_msl(source: str, name: str = "<source>") -> None:
    """Judges MSL as Apple's compiler would, on any machine: with Apple's compiler where
    ``xcrun --find metal`` finds it (``METALQWEN_MSL_CHECKER=clang`` declines it), else with
    clang's two passes against stub metal_stdlibs (C++14 with distinct address spaces, then C++
    for OpenCL). Raises CompileError with the diagnostics (``name``:line) for what Metal
    rejects; GpuError when neither compiler is found (``METALQWEN_CLANG`` names a clang >= 14).
    The CPU runtime runs this on every compile."""
    if not isinstance(source, str):
        raise TypeError(f"source must be MSL text (str), got {type(source).__name__}")
    _core.check_msl(source, name)


def _size3(value, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 positive integers, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


class Buffer:
    """Memory shared by the host and the GPU."""

    def __init__(self, native):
        self._native = native

    @property
    def nbytes(self) -> int:
        return self._native.nbytes

    def numpy(self, dtype=np.uint8, shape: Union[int, Sequence[int], None] = None) -> np.ndarray:
        """A copy of the contents viewed as ``dtype`` (and ``shape``; all of it by default)."""
        dtype = np.dtype(dtype)
        count = self.nbytes // dtype.itemsize if shape is None else int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize > self.nbytes:
            raise ValueError(f"shape {shape} of {dtype} needs {count * dtype.itemsize} bytes; the buffer has {self.nbytes}")
        data = np.frombuffer(memoryview(self._native), dtype=dtype, count=count).copy()
        return data if shape is None else data.reshape(shape)

    def write(self, array, offset: int = 0) -> None:
        """Copies ``array``'s bytes into the buffer at byte ``offset``."""
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if offset < 0 or offset + data.size > self.nbytes:
            raise ValueError(f"writing {data.size} bytes at offset {offset} overflows a {self.nbytes}-byte buffer")
        np.frombuffer(memoryview(self._native), dtype=np.uint8)[offset : offset + data.size] = data

    def __repr__(self) -> str:
        return f"<metalqwen.gpu.Buffer {self.nbytes} bytes>"


Argument = Union[Buffer, tuple, np.ndarray, np.generic, bytes, bytearray, memoryview]


class CommandBuffer:
    """Dispatches recorded in order, run after ``commit()``; errors surface at ``wait()``.

    Dispatches between two ``barrier()`` calls may run in any order."""

    def __init__(self, native):
        self._native = native

    def dispatch(self, kernel: "Kernel", args: Mapping[int, Argument], threadgroups, threads) -> None:
        """Like Metal's dispatchThreadgroups: ``threadgroups`` groups of ``threads`` threads."""
        self._bind(kernel, args)
        self._native.dispatch_threadgroups(_size3(threadgroups, "threadgroups"), _size3(threads, "threads"))

    def dispatch_threads(self, kernel: "Kernel", args: Mapping[int, Argument], grid, threads) -> None:
        """Like Metal's dispatchThreads: a grid of threads, edge groups partial."""
        self._bind(kernel, args)
        self._native.dispatch_threads(_size3(grid, "grid"), _size3(threads, "threads"))

    def barrier(self) -> None:
        self._native.barrier()

    def commit(self) -> None:
        self._native.commit()

    def wait(self) -> None:
        self._native.wait()

    def gpu_seconds(self) -> float:
        """After wait(): seconds the device ran this command buffer (Metal: GPUEndTime - GPUStartTime;
        the CPU runtime: its wall time)."""
        return self._native.gpu_seconds()

    def _bind(self, kernel: "Kernel", args: Mapping[int, Argument]) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"expected a Kernel, got {type(kernel).__name__}")
        if not isinstance(args, Mapping):
            raise TypeError("args must be a dict of argument index -> Buffer | (Buffer, offset) | array | bytes")
        self._native.set_kernel(kernel._native)
        for index, value in args.items():
            if not isinstance(index, (int, np.integer)) or not 0 <= index <= MAX_ARGUMENT_INDEX:
                raise ValueError(f"argument index must be an integer in 0..{MAX_ARGUMENT_INDEX}, got {index!r}")
            self._bind_one(int(index), value)

    def _bind_one(self, index: int, value: Argument) -> None:
        if isinstance(value, Buffer):
            self._native.set_buffer(index, value._native, 0)
        elif isinstance(value, tuple):
            if len(value) != 2 or not isinstance(value[0], Buffer) or not isinstance(value[1], (int, np.integer)):
                raise TypeError(f"argument {index}: a tuple must be (Buffer, byte offset), got {value!r}")
            if value[1] < 0:
                raise ValueError(f"argument {index}: negative offset {value[1]}")
            self._native.set_buffer(index, value[0]._native, int(value[1]))
        elif isinstance(value, (np.ndarray, np.generic)):
            self._native.set_bytes(index, np.ascontiguousarray(value).view(np.uint8).reshape(-1))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            self._native.set_bytes(index, np.frombuffer(value, dtype=np.uint8))
        else:
            raise TypeError(
                f"argument {index}: expected Buffer, (Buffer, offset), numpy array or bytes, got {type(value).__name__}"
            )


class Kernel:
    """A compute pipeline for one kernel function."""

    def __init__(self, native, device: "Device"):
        self._native = native
        self._device = device

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def max_threads_per_threadgroup(self) -> int:
        return self._native.max_threads_per_threadgroup

    @property
    def thread_execution_width(self) -> int:
        return self._native.thread_execution_width

    def dispatch(self, args: Mapping[int, Argument], threadgroups, threads) -> None:
        """Runs one dispatchThreadgroups and waits for it."""
        cb = self._device.command_buffer()
        cb.dispatch(self, args, threadgroups, threads)
        cb.commit()
        cb.wait()

    def dispatch_threads(self, args: Mapping[int, Argument], grid, threads) -> None:
        """Runs one dispatchThreads and waits for it."""
        cb = self._device.command_buffer()
        cb.dispatch_threads(self, args, grid, threads)
        cb.commit()
        cb.wait()

    def __repr__(self) -> str:
        return f"<metalqwen.gpu.Kernel {self.name}>"


class Library:
    """Compiled MSL source."""

    def __init__(self, native, device: "Device"):
        self._native = native
        self._device = device

    def kernel(self, name: str) -> Kernel:
        return Kernel(self._native.kernel(name), self._device)

    def kernel_names(self) -> list[str]:
        """The host names of every kernel function in the library."""
        return self._native.kernel_names()


class Device:
    """A GPU: ``Device()`` picks Metal where available, else the CPU runtime (on Apple silicon
    it raises GpuError with the reason instead)."""

    def __init__(self, kind: str | None = None, *, schedule: str | None = None,
                 checks: Sequence[str] | None = None):
        """CPU runtime only: ``schedule`` is "forward", "reverse" or "random:SEED", the order in
        which lanes, SIMD-groups and threadgroups run (default METALQWEN_CPU_SCHEDULE, else
        forward); ``checks`` turns on the checking mode: "races" reports unsynchronised
        conflicting accesses between threads, "bounds" out-of-bounds accesses, each as a GpuError
        at wait() (default METALQWEN_CPU_CHECKS, e.g. "races,bounds")."""
        if kind not in (None, "metal", "cpu"):
            raise ValueError(f'device kind must be "metal", "cpu" or None, got {kind!r}')
        if isinstance(checks, str) or not all(isinstance(c, str) for c in checks or ()):
            raise TypeError(f'checks must be a sequence of names such as ("races", "bounds"), got {checks!r}')
        cpu_options = schedule is not None or bool(checks)
        if cpu_options and kind != "cpu":
            raise ValueError('schedule= and checks= need the CPU runtime: Device("cpu", ...)')
        self._native = (_core.open_cpu_device(schedule or "", list(checks or ())) if cpu_options
                        else _core.open_device(kind or ""))

    @property
    def kind(self) -> str:
        return self._native.kind

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def max_buffer_length(self) -> int:
        """Bytes of the largest single buffer (Metal: maxBufferLength)."""
        return self._native.max_buffer_length

    @property
    def recommended_working_set(self) -> int:
        """Bytes the GPU may use in all (Metal: recommendedMaxWorkingSetSize)."""
        return self._native.recommended_working_set

    @property
    def gpu_cores(self) -> int:
        """GPU cores (Metal: Apple's chip table by name; the CPU runtime: a fixed 10)."""
        return self._native.gpu_cores

    @property
    def resident(self) -> tuple[int, int]:
        """(buffers, bytes) the device was asked to keep resident (the engine's weights, caches and
        workspace) and still alive. Metal on macOS 15+ keeps them in a residency set; macOS 14 and
        the CPU runtime only count them."""
        return tuple(self._native.resident)

    def compile(self, source: str, name: str = "<source>") -> Library:
        """Compiles MSL text; raises CompileError carrying the compiler's diagnostics."""
        if not isinstance(source, str):
            raise TypeError(f"source must be MSL text (str), got {type(source).__name__}")
        return Library(self._native.compile(source, name), self)

    def compile_notice(self, source: str, name: str = "<source>") -> str:
        """What compiling ``source`` will spend time on, for a progress line: "" when that is
        quick (the CPU runtime has the build cached), else a sentence saying what happens."""
        return self._native.compile_notice(source, name)

    def empty(self, nbytes: int) -> Buffer:
        """A new buffer with unspecified contents (the CPU runtime fills it with 0xFF: NaN as floats)."""
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative integer, got {nbytes!r}")
        return Buffer(self._native.new_buffer(int(nbytes)))

    def buffer(self, array) -> Buffer:
        """A new buffer holding a copy of ``array``'s bytes."""
        data = np.ascontiguousarray(array)
        buf = self.empty(data.nbytes)
        buf.write(data)
        return buf

    def command_buffer(self) -> CommandBuffer:
        return CommandBuffer(self._native.new_command_buffer())

    def __repr__(self) -> str:
        return f"<metalqwen.gpu.Device {self.kind}: {self.name}>"
