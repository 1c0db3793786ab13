"""The run's clocks: the main thread's time split by call (:mod:`~shmvec.clocks.call_clock`) and
``envs.timings`` (:mod:`~shmvec.clocks.timings`), the wall time in parts from that clock and the
lanes' timing rows (written by workers and the main shard: :mod:`shmvec.ipc.timing_rows`).

Backs ``docs/diagnostics.md``. May import ``errors``, ``options`` and ``ipc``; knows no pool.
"""
