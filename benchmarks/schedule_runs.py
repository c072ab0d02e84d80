"""Summarise runs of sweeps/schedules.sh: per run, the full-game return at the end of training and the traces of
N_envs, the clip epsilon and the DDR by thirds of the budget (a markdown table for RESULTS.md).

    python benchmarks/schedule_runs.py runs/schedules
"""

import argparse
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sweeps.aggregate import read_scalars  # noqa: E402


def thirds(steps: np.ndarray, values: np.ndarray, total: int) -> str:
    """Median of a trace in each third of the budget, as 'a / b / c' (the median: the DDR has outliers)."""
    chunks = [values[(steps > total * i / 3) & (steps <= total * (i + 1) / 3)] for i in range(3)]
    return " / ".join(f"{np.median(chunk):.3g}" if len(chunk) else "-" for chunk in chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir")
    parser.add_argument("--final-fraction", type=float, default=0.1, help="the end of training: this last part of the steps")
    options = parser.parse_args()
    print(
        f"| run | seed | games | return, last {options.final_fraction:.0%} of steps | last 50 games "
        "| N_envs, median by thirds | clip epsilon, same | DDR, same | SPS |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for args_path in sorted(glob.glob(os.path.join(options.sweep_dir, "*", "args.json"))):
        run_dir, args = os.path.dirname(args_path), json.load(open(args_path))
        scalars = read_scalars(run_dir)
        total = args["planned_steps"]
        steps, returns = scalars["charts/episodic_return"]
        final = returns[steps > (1 - options.final_fraction) * total]
        print(
            f"| {args['exp_name']} | {args['seed']} | {len(returns)} | {final.mean():.2f} ({len(final)} games) "
            f"| {returns[-50:].mean():.2f} | {thirds(*scalars['charts/num_envs'], total)} "
            f"| {thirds(*scalars['charts/clip_coef'], total)} | {thirds(*scalars['metrics/ddr'], total)} "
            f"| {scalars['charts/SPS'][1][-1]:.0f} |"
        )


if __name__ == "__main__":
    main()
