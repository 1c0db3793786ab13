"""Page-locking a pool's arena for CUDA: ``cudaHostRegister`` through torch, in the main process only.

A copy to a CUDA device from pageable memory goes through a pinned bounce buffer and
blocks the CPU; from page-locked (registered) memory it is one DMA, which can run
``non_blocking`` on a stream. The arena already holds every observation, so the main
process registers it once and copies straight from it::

    main process                                  workers
    pool started, every worker attached ───────── map the arena by name (their own mapping)
    pin(arena): cudaHostRegister(ptr, nbytes) ──── nothing: a worker never touches CUDA
    ... copies from the arena, non_blocking ...
    close(): synchronize, cudaHostUnregister ───── exit
    arena closed; unmapped with its last view

Registering pins the physical pages; the workers' mappings of the same pages are
unaffected. :class:`PinnedMemory` holds a view of the memory until it is unregistered, so
the mapping cannot go away while CUDA still has it. If registration fails, the caller
goes on with pageable copies after one warning.

The CUDA calls are the small functions of :class:`CudaHost`; tests replace
:data:`cuda_host` to check when and where they run without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from typing import Any

import numpy as np

HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context, not only the current one


class CudaHost:
    """The CUDA runtime calls pinning makes, through torch (imported only when called)."""

    def cuda_initialized(self) -> bool:
        """Whether torch already made this process's CUDA context (never imports torch or touches the driver).

        ``torch.cuda.is_available()`` is not asked: it may load the driver, and a context
        costs hundreds of MB of GPU memory and seconds, too much to make for pinning alone.
        """
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        is_initialized = getattr(cuda, "is_initialized", None)
        return bool(is_initialized()) if is_initialized is not None else False

    def register(self, address: int, nbytes: int, device: int | None) -> int:
        """``cudaHostRegister`` in ``device``'s context (None: the current device); the CUDA error code (0: success)."""
        import torch

        with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
            return int(torch.cuda.cudart().cudaHostRegister(address, nbytes, HOST_REGISTER_PORTABLE))

    def unregister(self, address: int, device: int | None) -> int:
        """``cudaHostUnregister``, once ``device``'s copies are done; the CUDA error code.

        Only that device is synchronized: synchronizing another would create a context there.
        """
        import torch

        with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
            torch.cuda.synchronize()  # no DMA may still read the memory
            return int(torch.cuda.cudart().cudaHostUnregister(address))

    def clear_error(self) -> None:
        """Consume the error a failed call left in the CUDA runtime's last-error slot.

        Otherwise the next error-checked CUDA call of this thread (any kernel launch) raises
        it, misattributed. torch exposes no ``cudaGetLastError``: call it in each copy of
        libcudart this process has loaded (loading a loaded library gives the same instance).
        """
        for path in _loaded_libcudart():
            try:
                ctypes.CDLL(path).cudaGetLastError()
            except (OSError, AttributeError):
                pass

    def error_name(self, code: int) -> str:
        try:
            import torch

            return torch.cuda.cudart().cudaGetErrorString(torch.cuda.cudart().cudaError(code))
        except Exception:
            return f"cudaError {code}"


cuda_host = CudaHost()


def _loaded_libcudart() -> list[str]:
    """Paths of the libcudart copies mapped into this process (torch wheels name theirs ``libcudart-<hash>.so.N``)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    fields = (line.split(maxsplit=5) for line in lines)  # address, perms, offset, dev, inode[, path]
    paths = {parts[5].removesuffix(" (deleted)") for parts in fields if len(parts) == 6}
    return sorted(path for path in paths if os.path.basename(path).startswith("libcudart"))


class PinnedMemory:
    """One range of memory registered with CUDA by this process; :meth:`release` unregisters it.

    Use :func:`pin`, which falls back (``None`` and one warning) when registration fails.
    """

    def __init__(self, memory: np.ndarray, address: int, device: int | None, host: CudaHost):
        self._memory: np.ndarray | None = memory  # keeps the mapping alive while registered
        self.address, self.nbytes, self.device = address, memory.nbytes, device
        self._host = host
        self._owner_pid = os.getpid()

    @property
    def registered(self) -> bool:
        return self._memory is not None

    def release(self) -> None:
        """Unregister (after every copy finished). Idempotent; a forked child's copy does nothing."""
        if self._memory is None or os.getpid() != self._owner_pid:
            return
        try:
            if self._host.unregister(self.address, self.device) != 0:
                self._host.clear_error()  # e.g. at interpreter exit, CUDA unloading: nothing left to undo
        except Exception:
            pass  # closing goes on; the driver drops the registration with the process
        self._memory = None


def pin(buffer: Any, what: str, device: int | None = None, host: CudaHost | None = None) -> PinnedMemory | None:
    """Register ``buffer`` (a writable buffer: the arena) with CUDA; ``None``, after one warning, if that fails.

    ``what`` names the memory in the warning; ``device``: the CUDA device whose context
    registers it (the memory is registered as portable: every device may copy from it).
    """
    host = host or cuda_host
    memory = np.frombuffer(buffer, dtype=np.uint8)
    address = memory.__array_interface__["data"][0]
    try:
        code = host.register(address, memory.nbytes, device)
        problem = None if code == 0 else host.error_name(code)
    except Exception as exc:  # torch without CUDA, CUDA refusing to start, ...
        code, problem = -1, f"{type(exc).__name__}: {exc}"
    if problem is None:
        return PinnedMemory(memory, address, device, host)
    if code != -1:
        host.clear_error()
    warnings.warn(
        f"shmvec could not page-lock {what} ({memory.nbytes:,} bytes) for CUDA ({problem}); "
        "copies to the GPU go through pageable memory (slower, and they block the CPU)",
        RuntimeWarning,
        stacklevel=_first_frame_outside_shmvec(),
    )
    return None


def _first_frame_outside_shmvec() -> int:
    """The ``stacklevel`` of the caller's own code (a vector env's constructor calls this from several layers down)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(2), 2  # level 1: pin(), which warns
    while frame is not None and frame.f_code.co_filename.startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level
