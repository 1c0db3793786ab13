"""The default's planning: how many workers, and whether your process steps envs too, when you
give no ``n_workers`` (:mod:`~shmvec.planning.plan`); the machine it plans for
(:mod:`~shmvec.planning.machine`), the timing of one env (:mod:`~shmvec.planning.env_timing`,
quiet: :mod:`~shmvec.planning.outside_effects`) and the layouts remembered between runs
(:mod:`~shmvec.planning.plan_memory`).

Backs ``docs/options.md`` (``n_workers=None``) and the plan memory of ``docs/process.md``. May
import ``errors``, ``options``, ``ipc`` and ``processes``; the pool (``engine``) calls it, it
never calls the pool: the process that times an env is started by the engine
(:mod:`shmvec.engine.timing_run`) and handed to the plan as a function.
"""
