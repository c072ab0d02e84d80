"""ppo_atari_envpool.py end to end on a tiny CPU budget."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import (
    PPO_TAGS,
    check_run_artifacts,
    interrupt_with_sigterm,
    only_run_dir,
    read_scalars,
    run_script,
    usage_error,
)

import ppo_atari_envpool

SCRIPT = "ppo_atari_envpool.py"


def test_tiny_run_writes_every_tag_and_artifact(tmp_path, tiny_ppo_flags):
    result = run_script(SCRIPT, *tiny_ppo_flags, "--runs-dir", str(tmp_path), "--checkpoint-interval", "3",
                        "--save-model", "--save-embeddings", "--embeddings-per-iteration", "10", "--capture-video",
                        "--track")  # fmt: skip
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert os.path.basename(run_dir).startswith("Breakout-v5__ppo_atari_envpool__1__")

    scalars = read_scalars(run_dir)
    assert PPO_TAGS <= set(scalars), PPO_TAGS - set(scalars)
    # 256 steps / 32 per iteration = 8 iterations, metrics on 2, 4, 6, 8
    assert [step for step, _ in scalars["charts/SPS"]] == [32 * i for i in range(1, 9)]
    assert [step for step, _ in scalars["metrics/feature_rank"]] == [64, 128, 192, 256]
    for tag in PPO_TAGS - {"losses/explained_variance"}:
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag
    assert all(0 < value <= 100 for _, value in scalars["metrics/ess_pct"])
    assert all(1 <= value <= 24 for _, value in scalars["metrics/feature_rank"])  # at most the metrics batch
    returns = [value for _, value in scalars["charts/episodic_return"]]
    assert all(value >= 0 for value in returns) and len(returns) >= 2  # Breakout scores are never negative

    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["batch_size"] == 32 and args["minibatch_size"] == 16 and args["num_iterations"] == 8

    check_run_artifacts(
        run_dir, "ppo_atari_envpool", iterations=8, global_step=256, metric_iterations=[2, 4, 6, 8], embedding_rows=40
    )


def test_seeded_runs_are_reproducible_and_separate_networks_log_critic_rank(tmp_path, tiny_ppo_flags):
    logged = []
    for name in ("a", "b"):
        result = run_script(SCRIPT, *tiny_ppo_flags, "--separate-networks", "--seed", "3",
                            "--runs-dir", str(tmp_path / name))  # fmt: skip
        assert result.returncode == 0, result.stderr
        logged.append(read_scalars(only_run_dir(tmp_path / name)))
    for tag in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl", "metrics/grad_kurtosis"):
        assert logged[0][tag] == logged[1][tag], tag
    assert "metrics/feature_rank_critic" in logged[0]


def test_sigterm_checkpoints_and_resume_reaches_the_same_total(tmp_path, tiny_ppo_flags):
    flags = [*tiny_ppo_flags, "--runs-dir", str(tmp_path)]
    flags[flags.index("--total-timesteps") + 1] = "1280"  # 40 iterations: long enough to interrupt
    interrupt_with_sigterm(SCRIPT, flags)
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    interrupted_at = checkpoint["iteration"]
    assert 1 <= interrupted_at < 40 and checkpoint["global_step"] == 32 * interrupted_at

    result = run_script(SCRIPT, "--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda")
    assert result.returncode == 0, result.stderr
    assert only_run_dir(tmp_path) == run_dir  # same run directory
    final = torch.load(checkpoint_path, weights_only=True)
    assert final["iteration"] == 40 and final["global_step"] == 1280
    assert json.load(open(os.path.join(run_dir, "done.json")))["global_step"] == 1280  # finished now
    steps = [step for step, _ in read_scalars(run_dir)["charts/SPS"]]
    assert steps == [32 * i for i in range(1, 41)]  # every iteration logged exactly once, up to the total


BAD_FLAGS = [
    (["--num-envs", "0"], "--num-envs must be positive"),
    (["--num-minibatches", "3"], "does not divide batch_size"),
    (["--minibatch-size", "5000"], "--minibatch-size must be in [1, batch_size=1024]"),
    (["--minibatch-size", "100"], "does not divide batch_size"),
    (["--total-timesteps", "100"], "smaller than one batch"),
    (["--env-id", "NoSuchGame-v5"], "not an EnvPool Atari task"),
    (["--env-id", "Ant-v5"], "not an EnvPool Atari task"),
    (["--env-id", "BigfishEasy-v0"], "not an EnvPool Atari task"),  # Procgen, with or without Qt
    (["--learning-rate", "-0.1"], "--learning-rate must be > 0"),
    (["--ent-coef", "-1"], "--ent-coef must be >= 0"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--max-episode-steps", "0"], "--max-episode-steps must be positive"),
    (["--resume", "/no/such/checkpoint.pt"], "no such checkpoint file"),
    (["--runs-dir", "/proc/forbidden"], "--runs-dir"),
    (["--num-envs", "eight"], "--num-envs"),
    (["--lr-scaling", "cubic"], "--lr-scaling"),
    (["--no-such-flag", "1"], "--no-such-flag"),
]


@pytest.mark.parametrize("flags, fragment", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(
        ppo_atari_envpool.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags]
    )
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")  # nothing was created


def test_resume_rejects_a_file_that_is_not_a_checkpoint(tmp_path, monkeypatch, capsys):
    model_only = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(2)}, model_only)
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    other_script = tmp_path / "pqn_checkpoint.pt"  # right keys, but another script's flags
    torch.save({"args": {"q_lambda": 0.65}, "model": {}, "optimizer": {}, "iteration": 1, "rng": {}}, other_script)
    cases = (
        (model_only, "is not a checkpoint.pt"),
        (tmp_path / "junk.pt", "not a readable checkpoint"),
        (other_script, "is not a checkpoint.pt of ppo_atari_envpool.py"),
    )
    for path, fragment in cases:
        assert fragment in usage_error(ppo_atari_envpool.main, monkeypatch, capsys, [SCRIPT, "--resume", str(path)])


@pytest.mark.parametrize("flags", [["--num-envs", "eight"], ["--num-minibatches", "3"], ["--resume", "/nope.pt"]])
def test_bad_flags_from_the_shell(tmp_path, flags):
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr


def test_minibatch_size_and_lr_scaling_derive_the_rest():
    args = ppo_atari_envpool.validate_and_derive(
        ppo_atari_envpool.Args(num_envs=32, num_steps=16, minibatch_size=64, lr_scaling="sqrt", runs_dir="/tmp")
    )
    assert args.batch_size == 512 and args.num_minibatches == 8 and args.minibatch_size == 64
    assert args.scaled_learning_rate == pytest.approx(2.5e-4 * 2)  # k = 32 / 8 = 4
    args = ppo_atari_envpool.validate_and_derive(
        ppo_atari_envpool.Args(num_envs=16, lr_scaling="linear", runs_dir="/tmp")
    )
    assert args.minibatch_size == 2048 // 4 and args.scaled_learning_rate == pytest.approx(5e-4)
    assert args.num_iterations == 10_000_000 // 2048
    args = ppo_atari_envpool.validate_and_derive(
        ppo_atari_envpool.Args(num_envs=16, lr_scaling="inverse", runs_dir="/tmp")
    )
    assert args.scaled_learning_rate == pytest.approx(1.25e-4)
