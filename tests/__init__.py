"""The test suite: tests/<layer>/ mirrors shmvec/<layer>/; the shared envs and helpers are the modules here."""
