"""Tests of shmvec.adapters: ShmPoolVecEnv against SB3 (test_sb3_*), ShmVectorEnv against Gymnasium
(test_vector*), registration."""
