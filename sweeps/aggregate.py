"""Turn run directories into figures and tables.

    python sweeps/aggregate.py curves runs/Breakout-v5__ppo_atari_envpool__1__* --out curve.png

Subcommands:
  curves   learning curve (any scalar tag, default charts/episodic_return) of one or more
           runs, smoothed with a moving average, one line per run, to a PNG (PDF with --pdf).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np


def read_scalar(run_dir: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one scalar tag over every event file of a run directory (resumed runs have several)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415

    points: list[tuple[int, float]] = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        accumulator = EventAccumulator(path, size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            points.extend((event.step, event.value) for event in accumulator.Scalars(tag))
    points.sort()
    return np.array([p[0] for p in points], dtype=np.int64), np.array([p[1] for p in points], dtype=np.float64)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` points (shorter at the start), same length as the input."""
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (cumulative[1:] - cumulative[np.arange(1, len(values) + 1) - counts]) / counts


def plot_curves(run_dirs: list[str], tag: str, out: str, window: int, pdf: bool) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axis = plt.subplots(figsize=(6, 4))
    for run_dir in run_dirs:
        steps, values = read_scalar(run_dir, tag)
        if len(steps) == 0:
            print(f"warning: {run_dir} has no {tag!r} scalars yet", file=sys.stderr)
            continue
        axis.plot(steps, moving_average(values, window), label=os.path.basename(run_dir.rstrip("/")))
        print(
            f"{os.path.basename(run_dir.rstrip('/'))}: {len(values)} points, last {window}: mean {values[-window:].mean():.2f}"
        )
    axis.set_xlabel("environment steps")
    axis.set_ylabel(
        tag.rsplit("/", maxsplit=1)[-1].replace("_", " ") + (f" (moving average of {window})" if window > 1 else "")
    )
    axis.set_title(tag)
    axis.grid(alpha=0.3)
    if len(run_dirs) <= 8:
        axis.legend(fontsize=6)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=120)
    if pdf:
        figure.savefig(os.path.splitext(out)[0] + ".pdf")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    curves = commands.add_parser("curves", help="learning curves of run directories")
    curves.add_argument("run_dirs", nargs="+", help="run directories (runs/{env_id}__{exp_name}__{seed}__{time})")
    curves.add_argument("--tag", default="charts/episodic_return", help="scalar tag to plot")
    curves.add_argument("--out", default="learning_curve.png", help="output PNG path")
    curves.add_argument("--smooth", type=int, default=10, help="moving-average window in logged points")
    curves.add_argument("--pdf", action="store_true", help="also write a PDF next to the PNG")
    args = parser.parse_args()
    missing = [d for d in args.run_dirs if not os.path.isdir(d)]
    if missing:
        parser.exit(2, f"error: not a run directory: {missing[0]}\n")
    if args.smooth < 1:
        parser.exit(2, "error: --smooth must be >= 1\n")
    plot_curves(args.run_dirs, args.tag, args.out, args.smooth, args.pdf)


if __name__ == "__main__":
    main()
