"""What a pause costs on this machine: a fixed piece of Python timed right after pauses.

In a training loop every process of a pool pauses once a step: the main process while
the workers step its envs, the workers while the policy computes. In a bare stepping
loop nobody pauses. On a machine whose cores also run other work meanwhile (a VM's host
schedules other guests on them), caches, TLBs and branch predictors are cold when a
process resumes, so the Python a step runs after a pause (checking and writing the
actions, the hand-off, reading the result rows) takes longer than a tight loop says.

The probe times :func:`shmvec.planning.env_timing.reference_loop` (the plan's yardstick for that
kind of Python work, ~6.5 µs on its calibration machine) once right after each pause,
sleeping or busy-waiting, for pauses of 0.1 to 10 ms, in turns with a tight loop (no
pause), and prints the medians::

    python bench/probes/pause_probe.py
    python bench/probes/pause_probe.py --pauses 0.5,5 --samples 400 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from shmvec.planning.env_timing import reference_loop  # noqa: E402

_now = time.perf_counter
MODES = ("sleep", "busy")


def time_after_pause(pause: float, mode: str, samples: int) -> float:
    """Median seconds of one :func:`reference_loop` called right after a ``pause`` of ``mode``
    (``"sleep"``: blocked in the kernel; ``"busy"``: spinning on the clock); ``pause`` 0: back to back."""
    times = []
    for _ in range(samples):
        start = _now()
        if mode == "sleep" and pause > 0.0:
            time.sleep(pause)
        else:
            while _now() - start < pause:
                pass
        start = _now()
        reference_loop()
        times.append(_now() - start)
    return statistics.median(times)


def probe(pauses: list[float], samples: int, rounds: int) -> dict[tuple[float, str], float]:
    """{(pause, mode): median seconds} over ``rounds`` rounds, each timing every cell in turn
    (the tight loop as ``(0.0, "busy")``), so that a slow minute hits all of them alike."""
    cells = [(0.0, "busy")] + [(pause, mode) for pause in pauses for mode in MODES]
    reference_loop()  # warm-up
    rounds_of: dict[tuple[float, str], list[float]] = {cell: [] for cell in cells}
    for _ in range(rounds):
        for pause, mode in cells:
            rounds_of[pause, mode].append(time_after_pause(pause, mode, samples))
    return {cell: statistics.median(values) for cell, values in rounds_of.items()}


def table(results: dict[tuple[float, str], float]) -> str:
    """The probe's results as lines: µs and multiples of the tight loop's time."""
    tight = results[0.0, "busy"]
    lines = [f"reference_loop() back to back: {tight * 1e6:.1f} µs", "pause    after sleeping      after busy-waiting"]
    for pause in sorted({pause for pause, _ in results if pause > 0.0}):
        cells = [f"{results[pause, mode] * 1e6:7.1f} µs ({results[pause, mode] / tight:4.1f}x)" for mode in MODES]
        lines.append(f"{pause * 1e3:5.1f} ms  " + "   ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pauses", default="0.1,0.3,1,3,10", help="pause lengths, ms, comma-separated")
    parser.add_argument("--samples", type=int, default=200, help="timed calls per cell and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pauses = [float(ms) / 1e3 for ms in args.pauses.split(",")]
    print(table(probe(pauses, args.samples, args.rounds)))


if __name__ == "__main__":
    main()
