"""Faults a user meets, each driven through the real tool: damaged or missing data in sweeps/aggregate.py."""

import json
import os
import subprocess
import sys

from conftest import ROOT
from torch.utils.tensorboard import SummaryWriter

AGGREGATE = os.path.join(ROOT, "sweeps", "aggregate.py")


def fake_run(sweep_dir, seed: int, episode_steps: list[int] | None, cut_events: bool = False) -> str:
    """A finished run directory of 1000 steps with episodes (return = step / 100) at `episode_steps`; None: no events."""
    run_dir = os.path.join(sweep_dir, f"Breakout-v5__ppo__{seed}__1")
    os.makedirs(run_dir)
    args = {
        "env_id": "Breakout-v5",
        "exp_name": "ppo",
        "seed": seed,
        "planned_steps": 1000,
        "num_iterations": 10,
        "batch_size": 100,
        "num_envs": 4,
        "num_steps": 25,
        "update_epochs": 4,
        "schedule": None,
    }
    json.dump(args, open(os.path.join(run_dir, "args.json"), "w"))
    json.dump({"global_step": 1000, "iterations": 10}, open(os.path.join(run_dir, "done.json"), "w"))
    if episode_steps is not None:
        writer = SummaryWriter(run_dir)
        for step in episode_steps:
            writer.add_scalar("charts/episodic_return", step / 100, step)
        writer.close()
    if cut_events:
        (path,) = [os.path.join(run_dir, name) for name in os.listdir(run_dir) if name.startswith("events.out")]
        os.truncate(path, os.path.getsize(path) // 2)
    return os.path.basename(run_dir)


def test_aggregate_reports_every_datum_it_drops_or_substitutes_and_strict_fails(tmp_path):
    sweep = tmp_path / "sweep"
    every_50 = list(range(50, 1001, 50))
    good = fake_run(sweep, 1, every_50)
    damaged = fake_run(sweep, 2, every_50, cut_events=True)
    without_events = fake_run(sweep, 3, None)
    early_only = fake_run(sweep, 4, [100, 200, 300])
    command = [sys.executable, AGGREGATE, "report", str(sweep), "--reps", "10", "--points", "2"]

    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    expected = [
        f"{damaged}: events.out.tfevents",
        f"{without_events}: no TensorBoard event file",
        f"{early_only}: no episode ended in the last 10% of the steps: its last 10 episodes score",
        f"{damaged}: no episode ended in the last 10% of the steps",  # the episodes after the cut are lost
        f"{without_events}: no episode ended: its final score is missing (nan)",
    ]
    for fragment in expected:
        assert sum(fragment in line for line in warnings) == 1, (fragment, warnings)
    assert len(warnings) == 5 and not any(good in line for line in warnings)
    report = (sweep / "report" / "report.md").read_text()
    notes = report.split("## Data left out or substituted")[1].strip().splitlines()
    assert notes == [f"- {line.removeprefix('warning: ')}" for line in warnings]

    strict = subprocess.run([*command, "--strict"], capture_output=True, text=True)
    assert strict.returncode == 1 and strict.stderr.strip().splitlines()[-1].startswith("error: --strict: 5 datum(s)")
    clean = subprocess.run(
        [sys.executable, AGGREGATE, "curves", str(sweep / good), "--out", str(tmp_path / "c.png"), "--strict"],
        capture_output=True,
        text=True,
    )
    assert clean.returncode == 0 and "warning" not in clean.stderr, clean.stderr
