"""What users run: the tuner (``python -m shmvec.tune``), the demo (``python -m shmvec.demo``) and
the stand-in policies they measure with."""
