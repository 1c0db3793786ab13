"""The local engine: :class:`~shmvec.engine.pool.ShmPool` (N envs in K worker processes), its
workers and collaborators, and :class:`~shmvec.engine.interface.Engine`, what adapters see of any engine."""
