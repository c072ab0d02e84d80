"""Mean episodic return of uniformly random actions on an EnvPool task: the "random policy"
line of the learning checks in RESULTS.md.

    python benchmarks/random_policy.py --env-id Ant-v5 --episodes 200
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import envpool
import numpy as np
import tyro


@dataclass
class Args:
    env_id: str = "Ant-v5"
    """EnvPool task (discrete or continuous actions)"""
    episodes: int = 200
    """finished episodes to average"""
    num_envs: int = 16
    """parallel environments"""
    seed: int = 1
    """seed of the environments and the random actions"""
    num_levels: int | None = None
    """Procgen only: play the levels start_level .. start_level + num_levels - 1 (as ppo_procgen.py)"""
    start_level: int = 0
    """Procgen only: first level seed, with --num-levels"""


def usage_error(flag: str, value, why: str) -> None:
    print(f"error: --{flag} {value}: {why}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
    family = envpool.registration.registry.specs.get(args.env_id, ("",))[0]  # (module, spec class, ...)
    if not family:  # EnvPool's own check is an assertion (a traceback), in envpool.make
        usage_error("env-id", args.env_id, "not an EnvPool task (envpool.list_all_envs() lists them)")
    if args.num_levels is not None and family != "envpool.procgen":
        usage_error("num-levels", args.num_levels, f"Procgen only, and {args.env_id} is not a Procgen task")
    # num-envs: a C int in EnvPool (1e20 ended in its traceback); so is each env seed, seed + env index, and no negative
    bounds = {
        "episodes": (args.episodes, 1, None),
        "num-envs": (args.num_envs, 1, 65536),
        "seed": (args.seed, 0, 2**31 - args.num_envs),
    }
    if args.num_levels is not None:
        bounds |= {"num-levels": (args.num_levels, 1, 2**31 - 1), "start-level": (args.start_level, 0, 2**31 - 1)}
    for flag, (value, low, high) in bounds.items():
        if not low <= value <= (high or value):
            usage_error(flag, value, f"must be at least {low}" + (f", at most {high}" if high else ""))
    levels = {} if args.num_levels is None else {"num_levels": args.num_levels, "start_level": args.start_level}
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=args.seed, **levels)
    space, rng = envs.action_space, np.random.default_rng(args.seed)
    envs.reset()
    episode_return, returns, lengths = np.zeros(args.num_envs), [], []
    while len(returns) < args.episodes:
        if hasattr(space, "n"):
            actions = rng.integers(0, space.n, size=args.num_envs)
        else:
            actions = rng.uniform(space.low, space.high, size=(args.num_envs, *space.shape))
        _, reward, terminated, truncated, info = envs.step(actions)
        episode_return += reward  # EnvPool's reset step has reward 0
        for index in np.flatnonzero(terminated | truncated):
            returns.append(episode_return[index])
            lengths.append(info["elapsed_step"][index])
            episode_return[index] = 0.0
    returns = np.array(returns[: args.episodes])
    print(
        f"{args.env_id}: {args.episodes} episodes of uniformly random actions: mean return {returns.mean():.1f} "
        f"(std {returns.std():.1f}, median {np.median(returns):.1f}), mean length {np.mean(lengths):.1f}"
    )


if __name__ == "__main__":
    main()
