"""Tests of shmvec.backends: the Ray backend on a simulated cluster."""
