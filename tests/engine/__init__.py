"""Tests of shmvec.engine: workers and shards, step paths, async batches, failures, restarts,
resources, the timing process."""
