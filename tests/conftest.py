"""Helpers shared by the end-to-end tests: run a script, read its TensorBoard scalars."""

import glob
import json
import os
import signal
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


def usage_error(main, monkeypatch, capsys, argv):
    """Run a script's main() in-process; it must exit 2 with one "error: ..." line and no stdout.

    Returns that line. In-process because importing torch and EnvPool once is much faster
    than once per bad flag; tests/test_*_e2e.py also check the real command line.
    """
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert captured.out == ""
    return lines[0]


def interrupt_with_sigterm(script, flags, wait_for="step "):
    """Start a script, send SIGTERM once a stdout line starts with `wait_for` (the first
    progress line comes after the first iteration); it must save and exit 128 + SIGTERM.
    Returns its stdout."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, script, *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for line in process.stdout:
        if line.startswith(wait_for):
            break
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "--resume" in stdout
    runs_dir = flags[flags.index("--runs-dir") + 1]
    assert not glob.glob(os.path.join(runs_dir, "*", "done.json"))  # interrupted: no completion marker
    return stdout


def check_run_artifacts(
    run_dir, exp_name, iterations, global_step, metric_iterations, embedding_rows, feature_dim=512, video=True
):
    """What --checkpoint-interval, --save-model, --save-embeddings, --capture-video and --track leave behind."""
    import numpy as np
    import torch

    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)  # plain data only
    assert checkpoint["iteration"] == iterations and checkpoint["global_step"] == global_step
    with open(os.path.join(run_dir, "done.json")) as marker:
        assert json.load(marker) == {"global_step": global_step, "iterations": iterations}
    model = torch.load(os.path.join(run_dir, f"{exp_name}.cleanrl_model"), weights_only=True)
    if "obs_rms" in model:  # ppo_isaacgym.py keeps the observation statistics with the weights
        model = model["model"]
    assert set(model) == set(checkpoint["model"])
    embeddings = np.load(os.path.join(run_dir, "embeddings.npz"))
    assert embeddings["features"].shape == (embedding_rows, feature_dim) and embeddings["values"].shape == (
        embedding_rows,
    )
    assert sorted(set(embeddings["iteration"].tolist())) == list(metric_iterations)
    if video:
        videos = os.listdir(os.path.join(run_dir, "videos"))
        assert any(name.endswith(".mp4") for name in videos), videos
    assert os.path.isdir(os.path.join(run_dir, "wandb"))
    return checkpoint
