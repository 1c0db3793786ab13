"""Tests of shmvec.tools: the tuner."""
