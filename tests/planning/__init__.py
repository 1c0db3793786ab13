"""Tests of shmvec.planning: the default plan, the machine it plans for, the plan memory."""
