"""What shmvec does in your process and how a worker's process is set up: the script's set-up
carried to workers (:mod:`~shmvec.processes.script_setup`, checked by
:mod:`~shmvec.processes.script_check`), workers that skip the main script
(:mod:`~shmvec.processes.lean_start`), their log records relayed to your handlers
(:mod:`~shmvec.processes.log_relay`), and your torch/OpenMP threads kept off the workers' cores
(:mod:`~shmvec.processes.caller_threads`, :mod:`~shmvec.processes.omp_spin`). The held Ctrl-C
lives in :mod:`shmvec.ipc.interrupts`, below, as the waits on workers use it.

Backs ``docs/process.md`` (the table of what changes in your process). May import ``errors``,
``options`` and ``ipc``; knows no pool.
"""
