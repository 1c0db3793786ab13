"""Tests of shmvec.processes: the script's set-up in workers, lean starts, the log relay, the
caller's threads, worker generators."""
