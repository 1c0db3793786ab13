"""The framework APIs over an engine: SB3's ``VecEnv`` (:mod:`.sb3`), Gymnasium's ``VectorEnv``
with async batches (:mod:`.vector`), and ``gym.make_vec`` registration."""
