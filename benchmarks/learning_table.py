"""The table of the learning checks in RESULTS.md: full-game returns of a few runs, one column per run.

    python benchmarks/learning_table.py runs/Breakout-v5__pqn_atari__1__* runs/Breakout-v5__pqn_atari__2__*

Reads each run's charts/episodic_return (full games, logged at the step the game ended) and prints a markdown table:
the mean return of the first 50 games, of all games, of the games ending after 60 % and after 90 % of the run's last
step, of the last 50 games, and the best game.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sweeps.aggregate import read_scalars  # noqa: E402


def main() -> None:
    run_dirs = sys.argv[1:]
    if not run_dirs or not all(os.path.isdir(run_dir) for run_dir in run_dirs):
        sys.exit("usage: python benchmarks/learning_table.py RUN_DIR [RUN_DIR ...] (run directories that exist)")
    games = [read_scalars(run_dir).get("charts/episodic_return") for run_dir in run_dirs]
    if any(game is None for game in games):
        sys.exit("error: a run directory without charts/episodic_return")
    rows = {"first 50 games": [], "all games": [], "games ending after 60 % of the steps": []}
    rows |= {"games ending after 90 % of the steps": [], "last 50 games": [], "best game": []}
    for steps, returns in games:
        last = steps.max()
        for name, selected in (
            ("first 50 games", returns[:50]),
            ("all games", returns),
            ("games ending after 60 % of the steps", returns[steps > 0.6 * last]),
            ("games ending after 90 % of the steps", returns[steps > 0.9 * last]),
            ("last 50 games", returns[-50:]),
        ):
            rows[name].append(f"{np.mean(selected):.2f} ({len(selected)})")
        rows["best game"].append(f"{returns.max():g}")
    print("| mean full-game return (games) | " + " | ".join(os.path.basename(d.rstrip("/")) for d in run_dirs) + " |")
    print("|---|" + "---|" * len(run_dirs))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
