"""The pool itself: :class:`~shmvec.engine.pool.ShmPool` (N envs in K worker processes), its
workers, links and shards, the step paths (synchronous, step tree, in this process, async
batches), restarts, failures and rare calls, the timing process the plan asks for, and
:class:`~shmvec.engine.interface.Engine`, what adapters see of any engine.

Backs ``docs/architecture.md`` and ``docs/failures.md``. May import ``errors``, ``options``,
``ipc``, ``processes``, ``clocks`` and ``planning``.
"""
