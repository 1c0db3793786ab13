"""shmvec benchmark suite: throughput, overhead and memory of vector envs, side by side.

Modules (one job each):

- :mod:`bench.synthetic` - an env with tunable step cost and observation size.
- :mod:`bench.workloads` - the envs benchmarked (CartPole, Acrobot, MuJoCo, Atari, synthetic).
- :mod:`bench.impls` - the vector env implementations compared, behind one small interface.
- :mod:`bench.measure` - timing: pre-generated actions, warm-up, round-robin repeats, medians.
- :mod:`bench.overhead` - per-step overhead with no env work and the overhead model.
- :mod:`bench.memory` - peak memory (RSS / USS / PSS) of the process tree.
- :mod:`bench.targets` - the target ratios, checked side by side.
- :mod:`bench.plots` - matplotlib figures.
- :mod:`bench.report` - the CLI that runs a grid and writes Markdown + PNG.
"""
