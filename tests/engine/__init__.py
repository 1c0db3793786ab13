"""Tests of shmvec.engine: plan, workers and shards, async batches, failures, restarts, resources."""
