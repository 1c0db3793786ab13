"""Tests of shmvec.clocks: the call clock and envs.timings."""
