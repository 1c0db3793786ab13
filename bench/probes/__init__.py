"""Diagnostics for maintainers: what one machine does to the figures (pauses, per-CPU speed,
run-to-run stability) and where a step's time goes (py-spy, timelines). Not the benchmark suite."""
