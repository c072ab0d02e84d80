"""Do torch's CPU threads slow EnvPool down? The host side of a training step on a GPU, without the GPU.

    python benchmarks/host_threads.py --num-envs 128

On a GPU the scripts' host work in a step is EnvPool's step, then one torch copy of its frames into page-locked
memory (here into ordinary memory: pinning needs CUDA). A copy this size runs on torch's OpenMP threads, which then
wait for more work by spinning for milliseconds, on the cores EnvPool's own threads step on. Prints env steps per
second of a loop of Breakout-v5 steps (random actions): the step alone, then the step and the copy with torch on one
thread (the scripts' default on a GPU) and on every core (torch's default), the three alternated --repeats times (the
median of each), and the last two's ratios to the first.
"""

import os
import statistics
import sys
import time
from dataclasses import dataclass

import envpool
import numpy as np
import torch
import tyro


@dataclass
class Args:
    num_envs: int = 32
    """envs stepped together"""
    steps: int = 300
    """batched steps per measurement"""
    repeats: int = 3
    """measurements of each setting, alternated"""


def steps_per_second(envs, num_envs: int, host_obs: torch.Tensor | None, steps: int, rng: np.random.Generator) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        next_obs = envs.step(rng.integers(0, envs.action_space.n, num_envs))[0]
        if host_obs is not None:
            host_obs.copy_(torch.from_numpy(next_obs))  # as the scripts stage EnvPool's frames for the GPU
    return steps * num_envs / (time.perf_counter() - start)


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
    # num-envs <= 65536: EnvPool's num_envs is a C int (1e20 ended in its traceback) and each env holds its frames
    bounds = {"num-envs": (args.num_envs, 1, 65536), "steps": (args.steps, 1, None), "repeats": (args.repeats, 1, None)}
    for flag, (value, low, high) in bounds.items():
        if not low <= value <= (high or value):
            print(f"error: --{flag} {value}: must be at least {low}" + (f", at most {high}" if high else ""), file=sys.stderr)
            sys.exit(2)
    envs = envpool.make("Breakout-v5", "gymnasium", num_envs=args.num_envs, seed=0, episodic_life=True, reward_clip=True)
    host_obs = torch.empty((args.num_envs, *envs.observation_space.shape), dtype=torch.uint8)
    envs.reset()
    rng = np.random.default_rng(0)
    cores = os.cpu_count() or 1
    settings = {"EnvPool alone": (None, cores), "and the copy, torch on 1 thread": (host_obs, 1)}
    settings[f"and the copy, torch on {cores} threads"] = (host_obs, cores)
    rates: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.repeats):
        for name, (copy_into, threads) in settings.items():
            torch.set_num_threads(threads)
            rates[name].append(steps_per_second(envs, args.num_envs, copy_into, args.steps, rng))
    alone = statistics.median(rates["EnvPool alone"])
    print(
        f"Breakout-v5, {args.num_envs} envs, {cores} cores: env steps/s of the loop (median of {args.repeats}), ratio to alone"
    )
    for name, values in rates.items():
        print(f"{name:40s} {statistics.median(values):>9,.0f}  {statistics.median(values) / alone:.2f}")


if __name__ == "__main__":
    main()
