"""Tests of shmvec.ipc: shared-memory layout, signals, hand-off protocol, action rows, leftovers."""
