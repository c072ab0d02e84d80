"""The ratio noise of --bf16: PPO's first minibatch, where the policy has not moved yet, in fp32 and in bf16.

    python benchmarks/ratio_noise.py                          # Breakout-v5, 8 and 128 envs x 128 steps
    python benchmarks/ratio_noise.py --num-envs 8 --iterations 3 --script ppo_procgen.py --env-id BigfishEasy-v0

The behaviour log-probabilities come from acting on batches of N_envs states; the update recomputes them on
minibatches. On the first minibatch of the first epoch the weights are those that acted, so any ratio != 1 there is
rounding: each run logs that minibatch's KL (Schulman's k3 estimator) and clip fraction as
`losses/first_minibatch_approx_kl` and `losses/first_minibatch_clipfrac`. This runs the script for --iterations
iterations per setting (same seed) and prints their mean and max over the iterations, next to the whole update's
`losses/approx_kl` and `losses/clipfrac` for scale.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from sweeps.aggregate import read_scalars  # noqa: E402


@dataclass
class Args:
    script: str = "ppo_atari_envpool.py"
    """a PPO script that logs the first-minibatch tags"""
    env_id: str = "Breakout-v5"
    """its task"""
    num_envs: tuple[int, ...] = (8, 128)
    """N_envs of each setting (--num-steps 128 each)"""
    num_steps: int = 128
    """N_RO"""
    iterations: int = 10
    """iterations per run"""
    seed: int = 1
    """the seed of every run"""
    cuda: bool = False
    """train on the GPU"""


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
    if not args.num_envs:  # it printed the table's header alone and exited 0
        print("error: --num-envs: give one N_envs or more", file=sys.stderr)
        sys.exit(2)
    for flag, value in {"iterations": args.iterations, "num-steps": args.num_steps, "num-envs": min(args.num_envs)}.items():
        if value < 1:  # the first run of the script refused --total-timesteps 0, after the header: exit 1
            print(f"error: --{flag} {value}: must be at least 1", file=sys.stderr)
            sys.exit(2)
    print(f"{args.script} on {args.env_id}, {args.iterations} iterations a run, seed {args.seed}; mean (max) over them")
    print(f"{'setting':<22}{'first minibatch KL':>28}{'first clip fraction':>28}{'update KL':>14}{'clip fraction':>15}")
    for num_envs in args.num_envs:
        for precision in ("fp32", "bf16"):
            with tempfile.TemporaryDirectory() as runs_dir:
                steps = args.iterations * num_envs * args.num_steps
                command = [sys.executable, os.path.join(ROOT, args.script), "--env-id", args.env_id, "--seed", str(args.seed)]
                command += ["--num-envs", str(num_envs), "--num-steps", str(args.num_steps), "--total-timesteps", str(steps)]
                command += ["--metrics-interval", "0", "--runs-dir", runs_dir, "--cuda" if args.cuda else "--no-cuda"]
                result = subprocess.run(
                    [*command, *(["--bf16"] if precision == "bf16" else [])], capture_output=True, text=True, check=False
                )
                if result.returncode:
                    sys.exit(f"error: {' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-300:]}")
                scalars = read_scalars(os.path.join(runs_dir, os.listdir(runs_dir)[0]))
            cells = []
            for tag in ("first_minibatch_approx_kl", "first_minibatch_clipfrac", "approx_kl", "clipfrac"):
                values = scalars[f"losses/{tag}"][1]
                cells.append(
                    f"{values.mean():.2e} ({values.max():.1e})" if tag.startswith("first") else f"{values.mean():.2e}"
                )
            print(f"{f'{num_envs} envs, {precision}':<22}{cells[0]:>28}{cells[1]:>28}{cells[2]:>14}{cells[3]:>15}")


if __name__ == "__main__":
    main()
