"""How long sweeps/aggregate.py takes to read a run's TensorBoard scalars: its own reader (`read_scalars`) against
TensorBoard's EventAccumulator, side by side on the same files, and whether both read the same points.

    .venv/bin/python benchmarks/read_events.py                      # a synthetic 10M-step PPO run, resumed once
    .venv/bin/python benchmarks/read_events.py --run-dir runs/RUN   # a run of yours

The synthetic run logs what ppo_atari_envpool.py logs at 8 x 128 (14 tags an iteration, the 9 metrics every 10th, a
game every other one) for --iterations iterations, and is resumed with purge_step from a checkpoint at 60 % after
logging to 70 %: the second event file hides the first one's last tenth, as TensorBoard does.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sweeps.aggregate import read_scalars  # noqa: E402

CHARTS = ("learning_rate", "num_envs", "clip_coef", "num_steps", "batch_size", "SPS")
LOSSES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")
LOSSES += ("first_minibatch_approx_kl", "first_minibatch_clipfrac")
METRICS = ("feature_rank", "dormant_pct", "weight_norm", "grad_kurtosis", "grad_norm", "ess_pct", "policy_variance")
METRICS += ("kl_behavior", "ddr")


def write_synthetic_run(run_dir: str, iterations: int) -> None:
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

    rng = np.random.default_rng(0)
    checkpoint, crash = int(0.6 * iterations), int(0.7 * iterations)
    for first, last, purge_step in ((1, crash, None), (checkpoint + 1, iterations, checkpoint * 1024 + 1)):
        writer = SummaryWriter(run_dir, purge_step=purge_step)
        for iteration in range(first, last + 1):
            step = iteration * 1024
            for group, names in (("charts", CHARTS), ("losses", LOSSES), ("metrics", METRICS * (iteration % 10 == 0))):
                for name in names:
                    writer.add_scalar(f"{group}/{name}", rng.normal(), step)
            if iteration % 2 == 0:
                writer.add_scalar("charts/episodic_return", rng.normal(), step)
                writer.add_scalar("charts/episodic_length", rng.integers(100, 5000), step)
        writer.close()
        time.sleep(1.1)  # the second file's name (its time in seconds) sorts after the first's


def read_with_tensorboard(run_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # not its line about each purge
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    scalars = {}
    for tag in accumulator.Tags()["scalars"]:
        points = sorted(((event.step, event.value) for event in accumulator.Scalars(tag)), key=lambda point: point[0])
        steps, values = np.array([p[0] for p in points], dtype=np.int64), np.array([p[1] for p in points])
        scalars[tag] = (steps[np.isfinite(values)], values[np.isfinite(values)])  # read_scalars leaves NaN and inf out
    return scalars


def best_time(read, run_dir: str, repeats: int):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        scalars = read(run_dir)
        times.append(time.perf_counter() - start)
    return min(times), scalars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", help="a run directory to read (default: a synthetic run, written first)")
    parser.add_argument("--iterations", type=int, default=9766, help="of the synthetic run (9766: 10M steps at 8 x 128)")
    parser.add_argument("--repeats", type=int, default=3, help="reads by each reader; the best time counts")
    args = parser.parse_args()
    for flag, value in (("iterations", args.iterations), ("repeats", args.repeats)):
        if not 1 <= value <= 10**7:  # ten million iterations: a file of 10 GB
            print(f"error: --{flag} {value}: must be at least 1, at most 10000000", file=sys.stderr)
            sys.exit(2)
    if args.run_dir is not None and not glob.glob(os.path.join(args.run_dir, "events.out.tfevents.*")):
        print(f"error: --run-dir {args.run_dir}: no TensorBoard event file there", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as folder:
        run_dir = args.run_dir or os.path.join(folder, "run")
        if args.run_dir is None:
            write_synthetic_run(run_dir, args.iterations)
        ours_time, ours = best_time(read_scalars, run_dir, args.repeats)
        tensorboard_time, tensorboard = best_time(read_with_tensorboard, run_dir, args.repeats)
    same = ours.keys() == tensorboard.keys() and all(
        np.array_equal(ours[tag][0], tensorboard[tag][0]) and np.array_equal(ours[tag][1], tensorboard[tag][1]) for tag in ours
    )
    points = sum(len(steps) for steps, _ in ours.values())
    print(f"{points:,} points in {len(ours)} tags; the same points from both readers: {same}")
    print(f"EventAccumulator {tensorboard_time:.2f} s, read_scalars {ours_time:.2f} s: {tensorboard_time / ours_time:.1f} x")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
