"""Would EnvPool's asynchronous mode speed up the rollout? Acting and stepping only, no learning.

    python benchmarks/async_envs.py

Times the rollout loop of ppo_atari_envpool.py (Nature-CNN policy on the CPU, Breakout-v5)
three ways, alternated: synchronous, `num_envs` envs stepped together; asynchronous, a pool
of 2 x `num_envs` envs answering in batches of `num_envs` (the policy acts on one batch while
the other steps); asynchronous, a pool of `num_envs` in batches of `num_envs` / 2.
Prints transitions per second of each.
"""

import os
import sys
import time
from dataclasses import dataclass

import envpool
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo_atari_envpool import Agent  # noqa: E402


@dataclass
class Args:
    num_envs: int = 8
    """envs per batch of actions (the synchronous pool's size)"""
    steps: int = 256
    """batches of actions per measurement"""
    repeats: int = 2
    """measurements of each mode, alternated"""


def transitions_per_second(agent: Agent, pool_size: int, batch_size: int, steps: int) -> float:
    envs = envpool.make(
        "Breakout-v5", env_type="gymnasium", num_envs=pool_size, batch_size=batch_size, episodic_life=True, reward_clip=True
    )
    envs.async_reset()  # every env resets; recv() returns the first batch_size that are ready
    start = time.perf_counter()
    for _ in range(steps):
        obs, _, _, _, info = envs.recv()
        with torch.inference_mode():
            action = agent.get_action_and_value(torch.from_numpy(obs))[0]
        envs.send(action.numpy(), info["env_id"])
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * batch_size / elapsed


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
    # num-envs >= 2: the third mode's batches are num_envs // 2; <= 65536: EnvPool's sizes are C ints (1e20 crashed it)
    bounds = {"num-envs": (args.num_envs, 2, 65536), "steps": (args.steps, 1, None), "repeats": (args.repeats, 1, None)}
    for flag, (value, low, high) in bounds.items():
        if not low <= value <= (high or value):
            print(f"error: --{flag} {value}: must be at least {low}" + (f", at most {high}" if high else ""), file=sys.stderr)
            sys.exit(2)
    torch.manual_seed(0)
    agent = Agent(num_actions=4, separate_networks=False)
    modes = {
        f"sync, {args.num_envs} envs": (args.num_envs, args.num_envs),
        f"async, pool of {2 * args.num_envs} in batches of {args.num_envs}": (2 * args.num_envs, args.num_envs),
        f"async, pool of {args.num_envs} in batches of {args.num_envs // 2}": (args.num_envs, args.num_envs // 2),
    }
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode, (pool_size, batch_size) in modes.items():
            rates[mode].append(transitions_per_second(agent, pool_size, batch_size, args.steps))
    for mode, values in rates.items():
        print(f"{mode:40s} {', '.join(f'{value:,.0f}' for value in values)} transitions/s")


if __name__ == "__main__":
    main()
