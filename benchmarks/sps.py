"""Throughput of ppo_atari_envpool.py next to EnvPool's raw stepping rate, in one run.

    python benchmarks/sps.py                      # defaults: Breakout-v5, 8 envs x 128 steps
    python benchmarks/sps.py --num-envs 64 --total-timesteps 262144 --cuda

Prints, measured on this machine in this one invocation:
  1. EnvPool's raw rate for the same num_envs with random actions (no learning);
  2. the training SPS with metrics off (--metrics-interval 0) and with metrics at the
     default interval, alternated `--repeats` times (median of each);
  3. the ratios: training / raw, and the throughput cost of the metrics (target < 5 %).
Training SPS is the script's own charts/SPS at the end of the run (env steps per second
of the training loop, imports and env creation excluded).
"""

from __future__ import annotations

import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Args:
    env_id: str = "Breakout-v5"
    """EnvPool Atari task"""
    num_envs: int = 8
    """parallel environments (as --num-envs)"""
    num_steps: int = 128
    """rollout length (as --num-steps)"""
    total_timesteps: int = 20 * 1024
    """steps per training run; use at least 2 x metrics-interval iterations"""
    metrics_interval: int = 10
    """the interval measured against metrics off (the script's default is 10)"""
    repeats: int = 2
    """training runs per setting, alternated off/on; the median is reported"""
    raw_steps: int = 2000
    """batched env.step calls for the raw EnvPool rate"""
    cuda: bool = False
    """train on the GPU (pass --cuda on a GPU machine)"""


def raw_envpool_sps(env_id: str, num_envs: int, steps: int) -> float:
    import envpool  # noqa: PLC0415

    envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=0, episodic_life=True, reward_clip=True)
    envs.reset()
    rng = np.random.default_rng(0)
    actions = rng.integers(0, envs.action_space.n, size=(steps, num_envs))
    start = time.perf_counter()
    for step in range(steps):
        envs.step(actions[step])
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * num_envs / elapsed


def training_sps(args: Args, metrics_interval: int) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as runs_dir:
        command = [sys.executable, os.path.join(ROOT, "ppo_atari_envpool.py"), "--env-id", args.env_id,
                   "--num-envs", str(args.num_envs), "--num-steps", str(args.num_steps),
                   "--total-timesteps", str(args.total_timesteps), "--metrics-interval", str(metrics_interval),
                   "--runs-dir", runs_dir, "--cuda" if args.cuda else "--no-cuda"]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        event_file = glob.glob(os.path.join(runs_dir, "*", "events.out.tfevents.*"))[0]
        accumulator = EventAccumulator(event_file)
        accumulator.Reload()
        return accumulator.Scalars("charts/SPS")[-1].value


def main() -> None:
    args = tyro.cli(Args)
    print(f"machine: {os.cpu_count()} CPUs, device {'cuda' if args.cuda else 'cpu'}; {args.env_id}, "
          f"{args.num_envs} envs x {args.num_steps} steps, {args.total_timesteps:,} steps per training run")  # fmt: skip
    raw = raw_envpool_sps(args.env_id, args.num_envs, args.raw_steps)
    off, on = [], []
    for _ in range(args.repeats):
        off.append(training_sps(args, 0))
        on.append(training_sps(args, args.metrics_interval))
    sps_off, sps_on = statistics.median(off), statistics.median(on)
    rows = [
        ("EnvPool raw step rate (random actions)", f"{raw:,.0f}"),
        ("training, metrics off", f"{sps_off:,.0f}  (runs: {', '.join(f'{x:.0f}' for x in off)})"),
        (
            f"training, metrics every {args.metrics_interval} iterations",
            f"{sps_on:,.0f}  (runs: {', '.join(f'{x:.0f}' for x in on)})",
        ),
        ("training (metrics off) / raw EnvPool", f"{sps_off / raw:.3f}"),
        ("metrics on / metrics off", f"{sps_on / sps_off:.3f}"),
        ("throughput cost of the metrics", f"{100 * (1 - sps_on / sps_off):.1f} %  (target < 5 %)"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))


if __name__ == "__main__":
    main()
