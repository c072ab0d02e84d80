"""Mean episodic return of uniformly random actions on an EnvPool task: the "random policy"
line of the learning checks in RESULTS.md.

    python benchmarks/random_policy.py --env-id Ant-v5 --episodes 200
"""

from __future__ import annotations

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


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
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
