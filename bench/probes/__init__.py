"""Diagnostics for maintainers: what one machine does to the figures (pauses, per-CPU speed,
how it moves) and where a step's time goes (timelines). Not the benchmark suite."""
