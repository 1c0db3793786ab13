"""Shared memory, signals and messages between the main process and its workers: the arena's
layout, the semaphores, the protocol and its hand-off invariant. Knows no pool."""
