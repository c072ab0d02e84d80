"""Solve rate of the uniformly random policy on a Kinetix task set: the "random policy" line of ppo_kinetix.py's
learning check in RESULTS.md, measured the way the script measures its own (ppo_kinetix.solve_rate).

    python benchmarks/kinetix_random_policy.py --task-set handmade --env-size s --attempts 64
    python benchmarks/kinetix_random_policy.py --task-set locomotion --env-size m --num-tasks 16

Every head of the MultiDiscrete policy uniform (the actor's weights and bias zero: logits 0), each task played
--attempts times from its start, the first episode only.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_kinetix  # noqa: E402


@dataclass
class Args:
    task_set: Literal["locomotion", "random", "handmade"] = "handmade"
    """as ppo_kinetix.py's --task-set"""
    env_size: Literal["s", "m", "l"] = "s"
    """as ppo_kinetix.py's --env-size"""
    num_tasks: int = 512
    """locomotion and random: as ppo_kinetix.py's --num-tasks (with --task-seed, the same set)"""
    task_seed: int = 0
    """as ppo_kinetix.py's --task-seed"""
    attempts: int = 64
    """episodes per task"""
    num_envs: int = 64
    """environments stepped together"""
    seed: int = 1
    """seed of the environments and the random actions"""


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # beside XLA's threads, as the script
    script_args = ppo_kinetix.Args(task_set=args.task_set, env_size=args.env_size, num_tasks=args.num_tasks)
    script_args.task_seed = args.task_seed
    ppo_kinetix.jax.config.update("jax_compilation_cache_dir", script_args.jax_cache_dir)
    tasks = ppo_kinetix.task_set(script_args, "")
    envs = ppo_kinetix.KinetixTasks(tasks, args.num_envs, torch.device("cpu"), seed=args.seed)
    agent = ppo_kinetix.Agent(envs.obs_dim, separate_networks=True)
    torch.nn.init.zeros_(agent.actor.weight), torch.nn.init.zeros_(agent.actor.bias)  # every action equally likely
    rate = ppo_kinetix.solve_rate(agent, envs, envs.levels, args.attempts)
    print(
        f"random policy on {len(tasks.names)} tasks ({args.task_set}, {args.env_size.upper()}), {args.attempts} "
        f"episodes each: solve rate {rate:.4f}"
    )


if __name__ == "__main__":
    main()
