"""GPU hand-off: ``ShmVectorEnv(device="cuda")`` against numpy results moved with ``.to()``.

One command, no network, a few minutes on a machine with a GPU (it prints the device it ran on)::

    python bench/gpu_handoff.py            # (a), (b) and (c), then one PASS/FAIL line per target
    python bench/gpu_handoff.py --smoke    # seconds on any machine (CI): tiny sizes, CUDA parts skipped without CUDA

(a) Host-to-device bandwidth, GB/s (median of 20 copies) at 1, 4, 16 and 64 MiB: from pageable
    numpy memory, from a shmvec arena page-locked as a pool page-locks its own
    (``shmvec.ipc.pinning``), and from ``torch.empty(..., pin_memory=True)``; and how much longer
    a copy from the arena takes than one from ``pin_memory`` (the same at every size: a cost per copy).
(b) Per-step hand-off, µs (median and p99 over 2000 steps), for 64 × 4×84×84 uint8 and
    64 × 376 float64 observations: ``torch.as_tensor(obs).to(dev)``, CleanRL's
    ``torch.Tensor(obs).to(dev)`` and ``device="cuda"``. "host" is the CPU time until the
    call returns (for ``device="cuda"``: the hand-off ``step`` makes, observations, rewards and
    flags, timed alone); "done" waits until the data is on the GPU; "step" is a whole
    ``step()`` of envs that cost nothing, hand-off included, until the data is on the GPU.
(c) A CleanRL-style PPO Atari loop with its policy on the GPU (``bench/gpu_ppo.py``): env
    steps per second, numpy results moved by CleanRL's ``torch.Tensor(obs).to()`` (float32 on
    the CPU), by ``torch.as_tensor(obs).to()`` (uint8) and, on CUDA, through pinned memory,
    against ``device="cuda"``, synchronous and with async batches; loops take turns, medians.

(d) The host side of ``device="cuda"``'s hand-off on CPU stand-ins for CUDA's calls
    (``shmvec.tools.cuda_stand_ins``, device tensors on torch's ``"meta"`` device: its dispatch,
    no data), on any machine: µs (median and p99) and the calls per hand-off (copies, events,
    stream calls, synchronizations, tensors made). No target: it shows what the host side is made of.

Targets: (a) page-locked arena >= 0.9x ``pin_memory`` and >= 2x pageable at every size;
(b) the host side of ``device="cuda"``'s hand-off <= 20 µs for 64 Atari frames; (c)
``device="cuda"`` >= each numpy baseline in env steps/s, sync and async.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `shmvec` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench import gpu_ppo  # noqa: E402
from bench.synthetic import SyntheticEnv  # noqa: E402
from shmvec import ShmVectorEnv  # noqa: E402
from shmvec.ipc import pinning  # noqa: E402
from shmvec.ipc.arena import OwnedArena  # noqa: E402

MiB = 1 << 20
SHAPES = {"4x84x84 uint8": ((4, 84, 84), "uint8"), "376 float64": ((376,), "float64")}  # an Atari frame stack, MuJoCo


def describe_machine(device: torch.device) -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU only (no CUDA: (a) skipped)"
    cuda = f", CUDA {torch.version.cuda}" if device.type == "cuda" else ""
    return (
        f"device: {where}; host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}, torch {torch.__version__}{cuda}"
    )


# ---- (a) bandwidth ------------------------------------------------------------------------


def bandwidth(device: torch.device, sizes_mib: list[int], repeats: int) -> list[dict]:
    """GB/s of one host-to-device copy from each kind of host memory, per size."""
    largest = max(sizes_mib) * MiB
    arena = OwnedArena(largest)
    pinned = pinning.pin(arena.buf, "the benchmark's arena", device.index)
    try:
        sources = {
            "pageable": torch.from_numpy(np.ones(largest, np.uint8)),
            "page-locked arena": torch.from_numpy(np.frombuffer(arena.buf, np.uint8)),
            "pin_memory": torch.ones(largest, dtype=torch.uint8, pin_memory=True),
        }
        if pinned is None:
            sources["page-locked arena (failed: pageable)"] = sources.pop("page-locked arena")
        rows = []
        for size in sizes_mib:
            target = torch.empty(size * MiB, dtype=torch.uint8, device=device)
            seconds: dict[str, list[float]] = {name: [] for name in sources}
            for _ in range(repeats):
                for name, source in sources.items():  # in turns: noise hits them alike
                    torch.cuda.synchronize(device)
                    start = time.perf_counter()
                    target.copy_(source[: size * MiB], non_blocking=True)
                    torch.cuda.synchronize(device)
                    seconds[name].append(time.perf_counter() - start)
            row = {"MiB": size, **{name: size * MiB / statistics.median(s) / 1e9 for name, s in seconds.items()}}
            if "page-locked arena" in seconds:  # a fixed cost per copy shows as the same difference at every size
                row["arena - pin_memory, µs"] = (
                    statistics.median(seconds["page-locked arena"]) - statistics.median(seconds["pin_memory"])
                ) * 1e6
            rows.append(row)
        return rows
    finally:
        if pinned is not None:
            pinned.release()
        arena.close()


# ---- (b) per-step hand-off ----------------------------------------------------------------


def _quantiles(samples: list[float]) -> str:
    us = np.array(samples) * 1e6
    return f"{np.median(us):8.1f} {np.percentile(us, 99):8.1f}"


def handoff(device: torch.device, n_envs: int, steps: int) -> list[tuple[str, str, dict[str, list[float]]]]:
    """Per shape and method: host time, time until done, and a whole step, each sample in seconds."""
    sync = functools.partial(torch.cuda.synchronize, device) if device.type == "cuda" else lambda: None
    numpy_ways = {
        "torch.as_tensor(obs).to(dev)": lambda obs: torch.as_tensor(obs).to(device),
        "torch.Tensor(obs).to(dev)  (CleanRL)": lambda obs: torch.Tensor(obs).to(device),
    }
    out = []
    for name, (shape, dtype) in SHAPES.items():
        label = f"{n_envs} x {name}"
        fns = [functools.partial(SyntheticEnv, obs_shape=shape, dtype=dtype)] * n_envs
        actions = np.zeros(n_envs, dtype=np.int64)
        with ShmVectorEnv(fns, n_workers=1) as envs:
            obs, _ = envs.reset(seed=0)
            for name, move in numpy_ways.items():
                samples: dict[str, list[float]] = {"host": [], "done": [], "step": []}
                for _ in range(steps):
                    obs = envs.step(actions)[0]
                    start = time.perf_counter()
                    move(obs)
                    samples["host"].append(time.perf_counter() - start)
                    sync()
                    samples["done"].append(time.perf_counter() - start)
                    start = time.perf_counter()
                    move(envs.step(actions)[0])
                    sync()
                    samples["step"].append(time.perf_counter() - start)
                out.append((label, name, samples))
        with ShmVectorEnv(fns, n_workers=1, device=device) as envs:
            envs.reset(seed=0)
            hand_off = envs._device  # the hand-off step() makes, called alone to time it (no public entry)
            pool = envs._pool
            samples = {"host": [], "done": [], "step": []}
            for _ in range(steps):
                envs.step(actions)
                sync()
                hand_off.before_write()  # the fence step_async checks, then the copies step_wait issues
                start = time.perf_counter()
                scalars = (pool.rewards, pool.terminated, pool.truncated)
                hand_off.results(envs.single_observation_space, pool.obs_leaves, pool.pickled_obs, scalars)
                samples["host"].append(time.perf_counter() - start)
                sync()
                samples["done"].append(time.perf_counter() - start)
                start = time.perf_counter()
                envs.step(actions)
                sync()
                samples["step"].append(time.perf_counter() - start)
            out.append((label, f'device="{device.type}"' + ("  (pinned)" if hand_off.pinned else ""), samples))
    return out


# ---- (c) PPO ------------------------------------------------------------------------------


def ppo(device: torch.device, n_envs: int, num_steps: int, iterations: int, repeats: int, synthetic: bool):
    loops, what = gpu_ppo.make_loops(n_envs, device, synthetic, num_steps)
    try:
        results: dict[str, list[tuple[float, float]]] = {loop.name: [] for loop in loops}
        n_actions = int(loops[0].envs.single_action_space.n)
        agents = {}
        for loop in loops:  # a warm-up iteration each (cuDNN autotuning, the envs' first resets)
            torch.manual_seed(0)
            agent = gpu_ppo.Agent(n_actions).to(device)
            agents[loop.name] = (agent, torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5))
            gpu_ppo.run_iterations(loop, *agents[loop.name], 1, seed=1)
        for r in range(repeats):
            for loop in loops[r % len(loops) :] + loops[: r % len(loops)]:  # rotated: each goes first in turn
                results[loop.name].append(gpu_ppo.run_iterations(loop, *agents[loop.name], iterations, seed=1))
        medians = {name: tuple(statistics.median(x) for x in zip(*samples)) for name, samples in results.items()}
        return what, [(loop, *medians[loop.name]) for loop in loops]
    finally:
        for loop in loops:
            loop.envs.close()


# ---- (d) the hand-off's calls, on stand-ins ----------------------------------------------


class _Host(pinning.CudaHost):
    """Page-locking that succeeds and does nothing (for the stand-ins)."""

    def register(self, address: int, nbytes: int, device: int | None) -> int:
        return 0

    def unregister(self, address: int, device: int | None) -> int:
        return 0


def stand_in_handoff(n_envs: int, steps: int) -> list[tuple[str, dict[str, float], list[float]]]:
    """Per shape: the calls of one hand-off and its host time (seconds per sample), CUDA's calls stood in."""
    from shmvec.adapters import cuda_copies
    from shmvec.tools.cuda_stand_ins import CATEGORIES, StandInCalls, TensorCount

    class MetaCalls(StandInCalls):
        target = "meta"

    saved = cuda_copies.cuda_calls, pinning.cuda_host
    cuda_copies.cuda_calls, pinning.cuda_host = MetaCalls, _Host()
    try:
        out = []
        for name, (shape, dtype) in SHAPES.items():
            fns = [functools.partial(SyntheticEnv, obs_shape=shape, dtype=dtype)] * n_envs
            with ShmVectorEnv(fns, n_workers=1, device="cuda") as envs:
                calls, samples = _counted_handoff(envs, steps, CATEGORIES, TensorCount)
                out.append((f"{n_envs} x {name}", calls, samples))
        return out
    finally:
        cuda_copies.cuda_calls, pinning.cuda_host = saved


def _counted_handoff(envs: ShmVectorEnv, steps: int, categories: tuple, tensor_count: type) -> tuple:
    envs.reset(seed=0)
    hand_off, pool, space = envs._device, envs._pool, envs.single_observation_space
    scalars = (pool.rewards, pool.terminated, pool.truncated)

    def one() -> None:  # as step() makes it: the fence before the workers write, then the copies
        hand_off.before_write()
        hand_off.results(space, pool.obs_leaves, pool.pickled_obs, scalars)

    for _ in range(20):
        one()
    counts, counted = hand_off._cuda.counts, 100
    counts.clear()
    with tensor_count(torch) as tensors:
        for _ in range(counted):
            one()
    calls = {kind: counts[kind] / counted for kind in categories}
    calls["tensors made"] = tensors.made / counted
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        one()
        samples.append(time.perf_counter() - start)
    return calls, samples


# ---- the command --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: checks that everything runs")
    p.add_argument("--device", default=None, help='default: "cuda" where torch sees it, else "cpu"')
    p.add_argument("--steps", type=int, default=2000, help="(b): steps per method")
    p.add_argument("--ppo-envs", type=int, default=16, help="(c): envs (async batches: half of them)")
    p.add_argument("--ppo-repeats", type=int, default=5, help="(c): turns of every loop; medians")
    p.add_argument("--synthetic", action="store_true", help="(c): the synthetic env even where ALE is installed")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    smoke = args.smoke
    print(describe_machine(device), flush=True)
    verdicts = []

    print("\n(a) host-to-device bandwidth, GB/s (median of 20)")
    if device.type != "cuda":
        print("skipped: no CUDA device")
    else:
        rows = bandwidth(device, [4] if smoke else [1, 4, 16, 64], 3 if smoke else 20)
        names = [name for name in rows[0] if name != "MiB"]
        print(f"{'MiB':>5} " + " ".join(f"{name:>22}" for name in names))
        for row in rows:
            print(f"{row['MiB']:>5} " + " ".join(f"{row[name]:>22.2f}" for name in names))
            if row["MiB"] < 4:  # below the targets' sizes: shows whether the gap is per copy or per byte
                continue
            arena, pinned, pageable = row.get("page-locked arena", 0.0), row["pin_memory"], row["pageable"]
            verdicts.append(_verdict(f"(a) {row['MiB']} MiB: arena >= 0.9x pin_memory", arena / pinned, 0.9))
            verdicts.append(_verdict(f"(a) {row['MiB']} MiB: arena >= 2x pageable", arena / pageable, 2.0))

    steps = 20 if smoke else args.steps
    print(f"\n(b) per-step hand-off, µs (median, p99 over {steps} steps)")
    print(f"{'observations':<20} {'method':<38} {'host':>17} {'done':>17} {'step':>17}")
    for label, name, samples in handoff(device, 4 if smoke else 64, steps):
        print(f"{label:<20} {name:<38} " + " ".join(_quantiles(samples[k]) for k in ("host", "done", "step")))
        if name.startswith('device="cuda"') and "uint8" in label:
            host = float(np.median(samples["host"])) * 1e6
            verdicts.append(_verdict("(b) device=cuda hand-off, host side, 64 Atari frames <= 20 µs", 20.0 / host, 1.0))

    print("\n(c) CleanRL-style PPO, policy on the device: env steps/s (median; whole loop, rollout only)")
    what, rates = ppo(
        device,
        n_envs=4 if smoke else args.ppo_envs,
        num_steps=4 if smoke else 128,
        iterations=1 if smoke else 2,
        repeats=1 if smoke else args.ppo_repeats,
        synthetic=args.synthetic or smoke,
    )
    print(f"envs: {what}")
    for loop, loop_rate, rollout_rate in rates:
        print(f"{loop.name:<80} {loop_rate:>10.0f} {rollout_rate:>10.0f}")
    for batches in (False, True):
        rate = {loop.how: loop_rate for loop, loop_rate, _ in rates if bool(loop.batch_size) == batches}
        kind = "async batches" if batches else "sync"
        for how, label in gpu_ppo.HAND_OFF_LABELS.items():  # each baseline a script may use, pinned on CUDA only
            if how in rate:
                verdicts.append(_verdict(f"(c) PPO {kind}: device >= {label}", rate["device"] / rate[how], 1.0))

    print("\n(d) the hand-off's host side on CPU stand-ins for CUDA's calls (meta tensors): µs (median, p99); calls")
    for label, calls, samples in stand_in_handoff(4 if smoke else 64, steps):
        listed = ", ".join(f"{kind} {count:g}" for kind, count in calls.items() if count)
        print(f"{label:<20} {_quantiles(samples)}   {listed}")

    mark = "" if device.type == "cuda" else " (no CUDA: this machine's CPU figures, not the targets' setting)"
    print("\ntargets" + mark)
    for line in verdicts:
        print(line)
    return verdicts


def _verdict(what: str, ratio: float, needed: float) -> str:
    return f"{'PASS' if ratio >= needed else 'FAIL'}  {what}: {ratio:.2f}x of the bound (needed >= {needed:g}x)"


if __name__ == "__main__":
    main()
