"""The closed / broken / pending state every pool (local, Ray) shares, and the checks made against it."""

from __future__ import annotations

from typing import Any, NoReturn

from shmvec.errors import AlreadyPendingError, ClosedEnvError, NoPendingCallError, StepStateError, WorkerDiedError

CLOSE_HINT = "; close() the env and create a new one"
# What a wait says when what it collects is not pending.
_NOT_PENDING = {
    "step": "step_wait() called with no pending step; call step_async() first",
    "request": "wait() called with no pending request; send() one first",
}


class Breakable:
    """The closed/broken/pending state every pool (local, Ray) shares: "broken" is one transition."""

    closed = False
    _broken: str | None = None  # why the pool is unusable
    pending: str | None = None  # "step" or "request": what the next wait collects
    batches: Any  # the pool's async schedule (``busy``: sends in flight or results not received)
    pickled: Any  # the pool's PickledLeaves (``action_paths``: action leaves with no fixed size)

    def _break(self, reason: str, error: BaseException | type[BaseException] = WorkerDiedError) -> NoReturn:
        """Remember why the pool is unusable, and raise ``error`` (a class gets the reason and the hint to close)."""
        self._broken = reason
        if isinstance(error, type):
            error = error(reason + CLOSE_HINT)
        error.__suppress_context__ = True  # e.g. the broken pipe that revealed the death says nothing more
        raise error

    def ensure_can_step(self, beside_sends: bool = False) -> None:
        """Raise at once if a step cannot start now (closed, broken, or a call pending).
        ``beside_sends``: async sends in flight do not stop it (an async reset of other envs)."""
        if self.closed or self._broken is not None:
            self.check_usable()
        if self.pending == "step":
            raise AlreadyPendingError(
                "step_async() called while a step is already pending; call step_wait() first", "step"
            )
        if self.pending == "request":
            raise AlreadyPendingError("a call is pending; wait for it before stepping", "request")
        if self.batches.busy and not beside_sends:
            raise AlreadyPendingError("envs have sends in flight or results not received: recv() them first", "send")

    def ensure_can_send(self, resetting: bool = False) -> None:
        """Raise at once if an async send cannot start now (closed, broken, a call pending
        other than the async reset in progress when ``resetting``, or pickled action leaves)."""
        self.check_usable()
        if self.pending is not None and not resetting:
            raise AlreadyPendingError(f"a {self.pending} is pending; wait for it before send()", self.pending)
        if self.pickled.action_paths:
            raise StepStateError("send()/recv() need fixed-size action spaces; use step() for this action space")

    def take_pending(self, kind: str) -> None:
        """A wait starts collecting the pending ``kind`` ("step" or "request"): raise unless it is the one pending."""
        self.check_usable()
        if self.pending != kind:
            raise NoPendingCallError(_NOT_PENDING[kind], kind)
        self.pending = None

    def check_usable(self) -> None:
        if self.closed:
            raise ClosedEnvError("this vector env is closed; create a new one")
        if self._broken is not None:
            raise WorkerDiedError(f"the pool is unusable: {self._broken}{CLOSE_HINT}")
