"""CPU stand-ins for the CUDA calls of ``device="cuda"``'s hand-off: check it, and count its calls, without a GPU.

:class:`StandInCalls` replaces :class:`~shmvec.adapters.cuda_copies.CudaCalls` (set
``shmvec.adapters.cuda_copies.cuda_calls`` to it before the env is made): "device" tensors
are CPU tensors (``"meta"`` ones to time the host's work alone), streams run in order and
an event completes only when synchronized, so a copy that is waited for too late shows.
Each stand-in makes the same torch calls as the real one (one tensor for a device buffer,
one for a pinned one), and every call is counted by kind in :attr:`StandInCalls.counts`:

- ``copies``: host-to-device copies (each into a fresh device buffer: an allocation);
- ``staging``: pinned host buffers (gathered rows);
- ``events``: events recorded; ``new events``: events made;
- ``stream ops``: the caller's stream looked up, the side stream made current and back,
  the caller's stream waiting for an event, a buffer marked as used on the caller's stream;
- ``synchronizations``: the CPU waiting for an event.

:class:`TensorCount` counts the tensors torch makes in its block (views included).

Example:
    >>> import torch
    >>> from shmvec.adapters import cuda_copies
    >>> cuda_copies.cuda_calls = StandInCalls  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

from shmvec.adapters.cuda_copies import CudaCalls

CATEGORIES = ("copies", "staging", "events", "new events", "stream ops", "synchronizations")


class StandInStream:
    """An in-order stream: its events complete in the order they were recorded, when one is synchronized."""

    def __init__(self, counts: Counter | None = None):
        self.recorded = self.completed = 0
        self.counts = counts if counts is not None else Counter()


class StandInEvent:
    def __init__(self, stream: StandInStream):
        self.stream, self.number = stream, 0

    def record(self) -> None:
        self.stream.recorded += 1
        self.number = self.stream.recorded

    def synchronize(self) -> None:
        self.stream.counts["synchronizations"] += 1
        self.stream.completed = max(self.stream.completed, self.number)

    @property
    def done(self) -> bool:
        return self.number <= self.stream.completed


class StandInCalls(CudaCalls):
    """CUDA's calls as CPU ones, counted. ``target``: where "device" tensors are (``"meta"``: no data is moved)."""

    target = "cpu"
    counts: Counter = Counter()  # of the last instance made (the env makes its own)
    stream = StandInStream()

    def __init__(self, torch: Any):
        super().__init__(torch)
        cls = type(self)
        cls.counts = self.counts = Counter()
        cls.stream = self.stream = StandInStream(self.counts)

    def available(self) -> bool:
        return True

    def start(self, device: Any) -> Any:
        self.device, self.side = self.torch.device("cuda", 0), "side stream"
        return self.device

    def caller(self) -> Any:
        self.counts["stream ops"] += 1
        return "the caller's stream"

    def on_side(self) -> Any:
        self.counts["stream ops"] += 2  # made current, and back
        return contextlib.nullcontext()

    def to_device(self, source: Any) -> Any:
        self.counts["copies"] += 1
        return source.clone() if self.target == "cpu" else source.to(self.target)

    def staging(self, nbytes: int) -> Any:
        self.counts["staging"] += 1
        return self.torch.empty(nbytes, dtype=self.torch.uint8)

    def record(self, event: Any = None) -> Any:
        self.counts["events"] += 1
        if event is None:
            self.counts["new events"] += 1
            event = StandInEvent(self.stream)
        assert event.done, "an event recorded again while a copy may still wait on it"
        event.record()
        return event

    def wait(self, stream: Any, event: Any) -> None:
        self.counts["stream ops"] += 1

    def keep(self, buffer: Any, stream: Any) -> None:
        self.counts["stream ops"] += 1


class TensorCount:
    """A context that counts the tensors torch makes in it (factories, copies, views): ``.made``."""

    def __init__(self, torch: Any):
        from torch.overrides import TorchFunctionMode

        counter = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if isinstance(out, torch.Tensor) and not any(out is arg for arg in args):
                    counter.made += 1
                return out

        self.made = 0
        self._mode = Mode()

    def __enter__(self) -> TensorCount:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
