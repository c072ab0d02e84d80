"""Helpers shared by the end-to-end tests: run a script, read its TensorBoard scalars."""

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every tag of the SPEC that ppo_atari_envpool.py writes.
PPO_TAGS = {
    "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
    "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
    "losses/explained_variance",
    "metrics/feature_rank", "metrics/dormant_pct", "metrics/weight_norm", "metrics/grad_kurtosis",
    "metrics/grad_norm", "metrics/ess_pct", "metrics/policy_variance", "metrics/kl_behavior", "metrics/ddr",
}  # fmt: skip


def run_script(script, *flags, env=None, timeout=600):
    """Run a project script with the CPU forced; return the CompletedProcess."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run(  # noqa: PLW1510 - callers assert on the return code
        [sys.executable, os.path.join(ROOT, script), *flags],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )


def only_run_dir(runs_dir):
    run_dirs = [d for d in glob.glob(os.path.join(runs_dir, "*")) if os.path.isdir(d)]
    assert len(run_dirs) == 1, run_dirs
    return run_dirs[0]


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} over every event file of the run directory, sorted by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        accumulator = EventAccumulator(path, size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((event.step, event.value) for event in accumulator.Scalars(tag))
    return {tag: sorted(values) for tag, values in scalars.items()}


@pytest.fixture
def tiny_ppo_flags():
    """A few iterations of 2 envs x 16 steps; a 40-step time limit guarantees finished games."""
    return ["--no-cuda", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2",
            "--total-timesteps", "256", "--max-episode-steps", "40", "--metrics-interval", "2",
            "--metrics-batch", "24"]  # fmt: skip
