"""Beukman et al. 2026's noisy convex problem (their Figs. 1b, 2a, 3b; Appendix A): SGD on f(x) = x^T x, x in R^50,
with Gaussian noise of std 3 / sqrt(50) added to every gradient, as a model of PPO's outer loop.

    python sweeps/convex_toy.py                                    # the three panels, in seconds on a CPU
    python sweeps/convex_toy.py --step-sizes 0.5 0.05 --out toy.png

Panels, each the mean over --seeds with a 95 % interval (mean +- 1.96 standard errors), plotted as in the paper
against the SGD step:
  (a) Fig. 1b: minus the distance to the optimum x* = 0 for each step size: too large a step plateaus far from the
      optimum, too small a one has not converged when the budget ends;
  (b) Fig. 2a: the update magnitude ||x_{t+1} - x_t||, large for a large step even once the distance stagnates;
  (c) Fig. 3b: at --restart-step, every run of --restart-step-sizes continues with each of the others: it moves to the
      plateau of its new step size, away from or towards the optimum (the legend: new step (from the old one)).
The SGD update x <- x - lr (2x + noise) contracts by (1 - 2 lr) a step, so a step size above 1 diverges. At the
stationary point E||x||^2 = dim noise_std^2 lr / (4 (1 - lr)): the printed table gives it beside the measured plateau.
The paper gives neither the start nor the step sizes: the start is a random direction at --init-distance from x*.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints the usage first: one line instead, as the scripts do
        fail(f"{message} (see --help)")


def fail(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description="SGD on a noisy convex problem: Beukman et al. 2026, Figs. 1b, 2a, 3b.")
    parser.add_argument("--dim", type=int, default=50, help="dimension of x (the paper: 50)")
    parser.add_argument("--noise-std", type=float, default=None, help="gradient noise std (default 3 / sqrt(dim))")
    parser.add_argument("--step-sizes", type=float, nargs="+", default=[0.3, 0.1, 0.01, 0.001], help="SGD step sizes")
    parser.add_argument("--steps", type=int, default=2000, help="SGD steps of every run")
    parser.add_argument("--seeds", type=int, default=5, help="runs per step size (the paper: 5)")
    parser.add_argument("--seed", type=int, default=1, help="first seed; runs use seed, seed + 1, ...")
    parser.add_argument("--init-distance", type=float, default=10.0, help="distance of the start from the optimum")
    parser.add_argument("--restart-step", type=int, default=None, help="step of the restarts (default: steps / 2)")
    parser.add_argument(
        "--restart-step-sizes", type=float, nargs="+", default=[0.3, 0.01], help="step sizes restarted with each other"
    )
    parser.add_argument("--out", default="convex_toy.png", help="the PNG to write")
    args = parser.parse_args(argv)
    args.noise_std = 3 / math.sqrt(args.dim) if args.noise_std is None else args.noise_std
    args.restart_step = args.steps // 2 if args.restart_step is None else args.restart_step
    for name in ("dim", "steps", "seeds"):
        if getattr(args, name) <= 0:
            fail(f"--{name} must be > 0, got {getattr(args, name)}")
    for name in ("noise_std", "init_distance"):
        if not 0 <= getattr(args, name) < math.inf:
            fail(f"--{name.replace('_', '-')} must be finite and >= 0, got {getattr(args, name)}")
    for step_size in [*args.step_sizes, *args.restart_step_sizes]:
        if not 0 < step_size < 1:  # the contraction 1 - 2 lr: at 1 and above the iterates grow without bound
            fail(f"step size {step_size}: give step sizes in (0, 1) (SGD on x^T x diverges from 1 on)")
    if not 0 < args.restart_step < args.steps:
        fail(f"--restart-step {args.restart_step} must be inside the run (0 < step < --steps {args.steps})")
    if len(set(args.restart_step_sizes)) < 2:
        fail(f"--restart-step-sizes {args.restart_step_sizes}: give at least two different step sizes")
    if os.path.dirname(os.path.abspath(args.out)) and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        fail(f"--out {args.out!r}: its folder does not exist")
    return args


def start(args: argparse.Namespace) -> np.ndarray:
    """One start a seed, (seeds, dim): a random direction at --init-distance from x* = 0, the same for every step size."""
    directions = np.stack([np.random.default_rng(args.seed + i).standard_normal(args.dim) for i in range(args.seeds)])
    return args.init_distance * directions / np.linalg.norm(directions, axis=1, keepdims=True)


def sgd(x: np.ndarray, step_size: float, steps: int, noise_std: float, seeds: list[int]) -> tuple[np.ndarray, ...]:
    """`steps` SGD steps from x (seeds, dim), each seed's noise its own stream. Returns the distances to x* = 0 after
    0..steps steps (seeds, steps + 1), the update magnitudes (seeds, steps) and the last x."""
    rngs = [np.random.default_rng(seed) for seed in seeds]
    distances, updates = [np.linalg.norm(x, axis=1)], []
    for _ in range(steps):
        noise = np.stack([rng.standard_normal(x.shape[1]) for rng in rngs]) * noise_std
        update = -step_size * (2 * x + noise)  # the gradient of x^T x is 2x
        x = x + update
        distances.append(np.linalg.norm(x, axis=1))
        updates.append(np.linalg.norm(update, axis=1))
    return np.stack(distances, axis=1), np.stack(updates, axis=1), x


def noise_seeds(args: argparse.Namespace, stream: int) -> list[int]:
    """The seeds of one noise stream: 0 for the runs from the start, 1 for the restarts' second halves."""
    return [10_000 * stream + args.seed + i for i in range(args.seeds)]


def run(args: argparse.Namespace) -> dict:
    """Every run: {"runs": {lr: (distances, updates)}, "restarts": {(old lr, new lr): distances after the restart}}."""
    x0 = start(args)
    runs, restarts = {}, {}
    for step_size in dict.fromkeys([*args.step_sizes, *args.restart_step_sizes]):
        runs[step_size] = sgd(x0, step_size, args.steps, args.noise_std, noise_seeds(args, 0))[:2]
    for old in dict.fromkeys(args.restart_step_sizes):  # the same first half as the run of `old` above
        _, _, x_half = sgd(x0, old, args.restart_step, args.noise_std, noise_seeds(args, 0))
        for new in dict.fromkeys(args.restart_step_sizes):
            if new != old:
                seeds = noise_seeds(args, 1)
                restarts[old, new] = sgd(x_half, new, args.steps - args.restart_step, args.noise_std, seeds)[0]
    return {"runs": runs, "restarts": restarts}


def plateau(distances: np.ndarray) -> float:
    """The mean distance over the seeds and the last 10 % of the steps."""
    return float(distances[:, -max(1, distances.shape[1] // 10) :].mean())


def predicted_plateau(args: argparse.Namespace, step_size: float) -> float:
    """sqrt(E||x||^2) at SGD's stationary point: per coordinate x' = (1 - 2 lr) x - lr noise, so
    Var = lr^2 s^2 / (1 - (1 - 2 lr)^2) = lr s^2 / (4 (1 - lr))."""
    return math.sqrt(args.dim * args.noise_std**2 * step_size / (4 * (1 - step_size)))


def band(axis, steps: np.ndarray, values: np.ndarray, label: str, **style) -> None:
    """Mean over the seeds (rows) and mean +- 1.96 standard errors."""
    mean = values.mean(axis=0)
    half_width = 1.96 * values.std(axis=0, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else np.zeros_like(mean)
    (line,) = axis.plot(steps, mean, label=label, **style)
    axis.fill_between(steps, mean - half_width, mean + half_width, color=line.get_color(), alpha=0.2, linewidth=0)


def draw(args: argparse.Namespace, results: dict) -> None:
    import matplotlib  # noqa: PLC0415 - only to draw

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    figure, (by_step_size, magnitude, restart) = pyplot.subplots(1, 3, figsize=(16, 4.5))
    steps = np.arange(args.steps + 1)
    for step_size in args.step_sizes:
        distances, updates = results["runs"][step_size]
        band(by_step_size, steps, -distances, f"step {step_size:g}")
        band(magnitude, steps[1:], updates, f"step {step_size:g}")
    by_step_size.set(title="(a) step sizes (Fig. 1b)", ylabel="- distance to the optimum")
    magnitude.set(title="(b) update magnitude (Fig. 2a)", ylabel="||x_{t+1} - x_t||", yscale="log")
    colours = {lr: f"C{i}" for i, lr in enumerate(dict.fromkeys(args.restart_step_sizes))}
    for step_size, colour in colours.items():  # the runs that keep their step size, then the restarts
        band(restart, steps, -results["runs"][step_size][0], f"{step_size:g} (kept)", color=colour, alpha=0.5, linestyle="--")
    after = np.arange(args.restart_step, args.steps + 1)
    for (old, new), distances in results["restarts"].items():
        band(restart, after, -distances, f"{new:g} (from {old:g})", color=colours[new])
    restart.axvline(args.restart_step, color="grey", linewidth=0.8)
    restart.set(title="(c) restart with another step size (Fig. 3b)", ylabel="- distance to the optimum")
    for axis in (by_step_size, magnitude, restart):
        axis.set_xlabel("SGD step")
        axis.legend(fontsize=8)
    for axis in (by_step_size, restart):  # the plateaus, not the first steps' fall from --init-distance
        axis.set_ylim(-3 * max(predicted_plateau(args, lr) for lr in results["runs"]), 0)
    figure.suptitle(f"SGD on x^T x, x in R^{args.dim}, gradient noise std {args.noise_std:.3g}; {args.seeds} seeds")
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    pyplot.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    results = run(args)
    print("| step size | distance, last 10 % of steps | stationary sqrt(E||x||^2) |\n|---|---|---|")
    for step_size, (distances, _) in results["runs"].items():
        print(f"| {step_size:g} | {plateau(distances):.4f} | {predicted_plateau(args, step_size):.4f} |")
    for (old, new), distances in results["restarts"].items():
        print(f"| {new:g} (from {old:g} at step {args.restart_step}) | {plateau(distances):.4f} | |")
    draw(args, results)
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
