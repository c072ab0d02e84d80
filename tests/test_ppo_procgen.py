"""ppo_procgen.py: IMPALA CNN shapes, reward scaling, the loss's statistics, checkpoints' loop state, EnvPool's Procgen
reset step, end to end."""

import json
import os
import sys
from types import SimpleNamespace

import envpool
import numpy as np
import pytest
import torch
from conftest import (
    PLANTED,
    PPO_TAGS,
    assert_optimizer_went_on,
    check_a_discarded_rollout_leaves_the_normalisers,
    check_bf16,
    check_run_artifacts,
    check_same_losses,
    fake_wandb,
    interrupt_with_sigterm,
    only_run_dir,
    plant_statistics,
    read_scalars,
    refused_over_two_processes,
    run_main,
    run_script,
    run_torchrun,
    stop_after_first_checkpoint,
    tyro_error,
    usage_error,
)

import metrics
import ppo_procgen
from ppo_procgen import (
    Args,
    ResidualBlock,
    RunningMeanStd,
    compute_gradients,
    conv_sequence,
    impala_cnn,
    learning_rate,
    minibatch_statistics,
    ppo_loss,
    scale_rewards,
)

SCRIPT = "ppo_procgen.py"
# 4 envs x 32 steps x 8 iterations: 256 steps per env, several BigFish episodes (a random fish dies within ~50-300)
TINY = "--no-cuda --num-envs 4 --num-steps 32 --num-minibatches 2 --update-epochs 2 --total-timesteps 1024".split()
TINY += "--metrics-interval 2 --metrics-batch 24".split()


def test_impala_blocks_keep_or_halve_the_shape():
    x = torch.randn(5, 16, 32, 32)
    assert ResidualBlock(16)(x).shape == x.shape
    assert conv_sequence(3, 16)(torch.randn(5, 3, 64, 64)).shape == (5, 16, 32, 32)
    encoder = impala_cnn()
    with metrics.hidden_activations(encoder) as activations:  # every post-ReLU output, as measure_agent collects them
        features = encoder(torch.rand(5, 3, 64, 64))
    assert features.shape == (5, 256)
    # 3 stages x 2 residual blocks x 2 ReLUs, the flattened stage output and the dense layer
    assert len(activations) == 14
    assert [tuple(a.shape[1:]) for a in activations[::4]] == [(16, 32, 32), (32, 16, 16), (32, 8, 8), (32, 8, 8)]
    assert activations[-1] is features and all((a >= 0).all() for a in activations)
    # the dense layer keeps PyTorch's default init, as CleanRL's: uniform within 1 / sqrt(fan_in) = 0.022 (orthogonal with
    # gain sqrt(2) gives entries of std sqrt(2 / 2048) = 0.031, and a bias of 0)
    dense, bound = encoder[-2], 1 / (32 * 8 * 8) ** 0.5
    assert dense.weight.abs().max() <= bound and 0 < dense.bias.abs().max() <= bound


def test_residual_block_is_identity_plus_two_convolutions():
    block = ResidualBlock(2)
    x = torch.randn(1, 2, 4, 4)
    expected = x + block.conv1(torch.relu(block.conv0(torch.relu(x))))
    torch.testing.assert_close(block(x), expected)


def test_running_mean_std_merges_moments_as_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(2.0, 3.0, size=(50, 3)), rng.normal(-1.0, 0.5, size=(30, 3))
    rms = RunningMeanStd((3,))  # holding the statistics of a, then merging b
    rms.mean, rms.var, rms.count = torch.tensor(a.mean(0)), torch.tensor(a.var(0)), torch.tensor(50.0, dtype=torch.float64)
    rms.update(torch.tensor(b), torch.ones(30))
    both = np.concatenate([a, b])
    np.testing.assert_allclose(rms.mean.numpy(), both.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), both.var(0), rtol=1e-12)
    assert rms.count.item() == 80


def test_running_mean_std_leaves_out_weight_zero_rows():
    rng = np.random.default_rng(1)
    rms, kept = RunningMeanStd((2,)), []
    for _ in range(5):
        batch = rng.normal(5.0, 2.0, size=(16, 2))
        weights = (rng.random(16) > 0.3).astype(np.float64)
        rms.update(torch.tensor(batch), torch.tensor(weights))
        kept.append(batch[weights == 1])
    kept = np.concatenate(kept)
    # the prior (mean 0, var 1, count 1e-4) moves the answer by about 1e-4 / N
    np.testing.assert_allclose(rms.mean.numpy(), kept.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var.numpy(), kept.var(0), rtol=1e-3)
    assert rms.count.item() == pytest.approx(len(kept) + 1e-4)
    rms.update(torch.ones(4, 2), torch.zeros(4))  # all reset steps: nothing changes
    np.testing.assert_allclose(rms.mean.numpy(), kept.mean(0), rtol=1e-4)


def test_scale_rewards_by_hand():
    rms = RunningMeanStd()
    rms.var.fill_(4.0)
    rms.count.fill_(1e9)  # frozen: std 2
    running = torch.tensor([1.0, 3.0])
    rewards, dones = torch.tensor([2.0, 50.0]), torch.tensor([0.0, 1.0])
    scaled, running = scale_rewards(rewards, torch.ones(2), dones, running, rms, gamma=0.5, clip=10.0)
    torch.testing.assert_close(scaled, torch.tensor([1.0, 10.0]))  # 2 / 2, and 50 / 2 clipped to 10
    torch.testing.assert_close(running, torch.tensor([2.5, 0.0]))  # 0.5 * 1 + 2; the second episode ended

    fresh = RunningMeanStd()
    rewards, valid = torch.tensor([1.0, 7.0]), torch.tensor([1.0, 0.0])
    _, running = scale_rewards(rewards, valid, torch.zeros(2), torch.zeros(2), fresh, gamma=0.9, clip=10.0)
    assert fresh.count.item() == pytest.approx(1 + 1e-4)  # the reset step (valid 0) is not counted
    assert fresh.mean.item() == pytest.approx(1.0, rel=1e-3)


def test_running_mean_std_weights_are_optional_and_rewards_are_divided_by_its_std():
    """ppo_isaacgym's RunningMeanStd: no weights counts every row; scale_rewards divides by `.std`, sqrt(var + 1e-8)."""
    batch = torch.randn(16, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 3
    unweighted, weighted = RunningMeanStd((2,)), RunningMeanStd((2,))
    unweighted.update(batch)
    weighted.update(batch, torch.ones(16))
    for name, value in weighted.state_dict().items():
        assert torch.equal(unweighted.state_dict()[name], value), name
    rms = RunningMeanStd()
    rms.var.fill_(1e-8)  # a std of sqrt(2e-8), not 1e-4
    scaled, _ = scale_rewards(torch.tensor([1e-4]), torch.zeros(1), torch.zeros(1), torch.zeros(1), rms, gamma=0.9, clip=10.0)
    torch.testing.assert_close(scaled, torch.tensor([1e-4 / 2e-8**0.5]))


LOSS_COEFFICIENTS = dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=True)


def test_ppo_loss_divides_by_the_count_of_the_statistics_it_is_given():
    """The loss takes minibatch_statistics' count and moments (under torchrun, those of every process's real
    transitions) as an argument: twice the count halves every term; reset steps (valid 0) count nowhere."""
    generator = torch.Generator().manual_seed(3)
    minibatch = {name: torch.randn(6, generator=generator) for name in ("logprobs", "values", "advantages", "returns")}
    minibatch["valid"] = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    new = [torch.randn(6, generator=generator) * 0.1 for _ in range(3)]  # new log-prob, value, entropy
    statistics = minibatch_statistics(minibatch)
    real = minibatch["advantages"][minibatch["valid"].bool()]
    assert statistics["valid_count"].item() == 4
    torch.testing.assert_close(statistics["advantage_mean"], real.mean())
    torch.testing.assert_close(statistics["advantage_std"], real.std(correction=0))
    loss, stats = ppo_loss(*new, minibatch, statistics, **LOSS_COEFFICIENTS)
    entropy = new[2][minibatch["valid"].bool()].sum() / 4
    torch.testing.assert_close(stats["entropy"], entropy)
    doubled = statistics | {"valid_count": statistics["valid_count"] * 2}
    half_loss, half_stats = ppo_loss(*new, minibatch, doubled, **LOSS_COEFFICIENTS)
    torch.testing.assert_close(half_loss, loss / 2)
    for name, value in stats.items():
        torch.testing.assert_close(half_stats[name], value / 2)


def test_compute_gradients_backpropagates_the_loss_of_the_flags():
    torch.manual_seed(0)
    agent, args = ppo_procgen.Agent(15, separate_networks=True), Args(clip_coef=0.3, ent_coef=0.02, clip_vloss=False)
    minibatch = {"obs": torch.randint(0, 256, (6, 3, 64, 64), dtype=torch.uint8), "actions": torch.randint(0, 15, (6,))}
    minibatch |= {name: torch.randn(6) for name in ("logprobs", "values", "advantages", "returns")}
    minibatch["valid"] = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    statistics = minibatch_statistics(minibatch)
    stats = compute_gradients(agent, minibatch, statistics, args)
    assert all(parameter.grad is not None for parameter in agent.parameters())
    with torch.no_grad():
        _, logprob, entropy, value, _ = agent.get_action_and_value(minibatch["obs"], minibatch["actions"])
    flags = dict(clip_coef=0.3, clip_vloss=False, ent_coef=0.02, vf_coef=0.5, norm_adv=True)
    _, expected = ppo_loss(logprob, value, entropy, minibatch, statistics, **flags)
    for name, value in expected.items():
        torch.testing.assert_close(stats[name], value, msg=name)


def test_learning_rate_is_scaled_for_num_envs_and_annealed_over_the_planned_steps():
    """The learning_rate function (ppo_atari_envpool's) replaces the derived scaled_learning_rate: --lr-scaling sqrt
    with 4x the reference envs doubles it; --anneal-lr takes it to 0 linearly over the iterations' steps."""
    flags = dict(num_envs=256, num_steps=4, total_timesteps=4100, lr_scaling="sqrt", learning_rate=5e-4)
    args = ppo_procgen.validate_and_derive(Args(**flags))
    assert (args.batch_size, args.num_iterations, args.planned_steps) == (1024, 4, 4096)
    assert [learning_rate(args, 256, step) for step in (0, 2048)] == [pytest.approx(1e-3)] * 2  # constant by default
    args.anneal_lr = True
    rates = [learning_rate(args, 256, (iteration - 1) * 1024) for iteration in (1, 2, 3, 4)]
    assert rates == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])


def test_an_interrupted_finish_checkpoints_the_loop_state_of_the_last_full_iteration(tmp_path):
    """finish_run and save_checkpoint take the loop's state: the interrupted iteration does not count; the checkpoint
    holds the counters and every module, the reward statistics included."""
    args = ppo_procgen.validate_and_derive(Args(num_envs=4, num_steps=32, total_timesteps=1024))
    quiet = SimpleNamespace(close=lambda: None)
    modules = {"model": torch.nn.Linear(2, 2), "return_rms": RunningMeanStd()}
    with pytest.raises(SystemExit) as stopped:
        ppo_procgen.finish_run(str(tmp_path), quiet, quiet, args, {"iteration": 3, "global_step": 256}, [], [15], **modules)
    assert stopped.value.code == 128 + 15
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (2, 256)
    assert {"model", "return_rms", "args", "rng"} <= set(checkpoint)
    ppo_procgen.save_checkpoint(str(tmp_path), args, {"iteration": 8, "global_step": 1024}, [], **modules)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["iteration"] == 8


def test_every_easy_procgen_task_has_a_normalisation_range():
    easy = [env_id for env_id in envpool.list_all_envs() if env_id.endswith("Easy-v0")]
    assert len(easy) == 16
    for env_id in easy:
        low, high = metrics.PROCGEN_RETURN_RANGE[env_id.removesuffix("Easy-v0").lower()]
        assert metrics.procgen_normalized_score(env_id, high) == pytest.approx(1.0)


def test_envpool_procgen_resets_on_the_step_after_an_episode_ends():
    """The assumption behind the reset-step mask, checked on EnvPool's Procgen itself."""
    envs = envpool.make("BigfishEasy-v0", env_type="gymnasium", num_envs=1, seed=0)
    envs.reset()
    for _step in range(3000):
        _, _, terminated, truncated, info = envs.step(np.zeros(1, dtype=np.int32))
        if terminated[0] or truncated[0]:
            break
    assert terminated[0] and info["elapsed_step"][0] > 1  # the idle fish is eaten
    _, reward, terminated, truncated, info = envs.step(np.zeros(1, dtype=np.int32))
    assert reward[0] == 0 and not terminated[0] and not truncated[0] and info["elapsed_step"][0] == 0


def test_envpool_num_levels_fixes_the_level_whatever_the_seed():
    """What --num-levels/--start-level mean: one level -> the same first frame under any seed."""

    def first_frames(**levels):
        pools = [envpool.make("BigfishEasy-v0", env_type="gymnasium", num_envs=1, seed=seed, **levels) for seed in (1, 2)]
        return [pool.reset()[0][0] for pool in pools]

    one_level = first_frames(num_levels=1, start_level=7)
    assert np.array_equal(one_level[0], one_level[1])
    all_levels = first_frames()
    assert not np.array_equal(all_levels[0], all_levels[1])


def test_level_flags_reach_envpool(tmp_path, monkeypatch):
    made, real_make = [], envpool.make

    def recording_make(*args, **kwargs):
        made.append(kwargs)
        return real_make(*args, **kwargs)

    monkeypatch.setattr(envpool, "make", recording_make)
    flags = [*TINY, "--total-timesteps", "128", "--num-levels", "1", "--start-level", "7", "--runs-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [SCRIPT, *flags])
    ppo_procgen.main()
    assert made and all(kwargs["num_levels"] == 1 and kwargs["start_level"] == 7 for kwargs in made)
    assert json.load(open(os.path.join(only_run_dir(tmp_path), "done.json")))["global_step"] == 128


def test_tiny_run_writes_every_tag_and_artifact(tmp_path):
    artifacts = "--checkpoint-interval 3 --save-model --save-embeddings --embeddings-per-iteration 10 --capture-video"
    track, env = fake_wandb(tmp_path)
    result = run_script(SCRIPT, *TINY, "--runs-dir", str(tmp_path), *artifacts.split(), *track, env=env)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert os.path.basename(run_dir).startswith("BigfishEasy-v0__ppo_procgen__1__")
    scalars = read_scalars(run_dir)
    expected = PPO_TAGS | {"charts/normalized_return"}
    assert expected <= set(scalars), expected - set(scalars)
    assert [step for step, _ in scalars["metrics/feature_rank"]] == [256, 512, 768, 1024]
    returns, normalized = scalars["charts/episodic_return"], scalars["charts/normalized_return"]
    assert len(returns) >= 2 and len(returns) == len(normalized)
    for (step, raw), (same_step, value) in zip(returns, normalized, strict=True):
        assert step == same_step and value == pytest.approx((raw - 1.0) / 39.0, abs=1e-6)  # bigfish [1, 40]
    assert all(0 < length <= 256 for _, length in scalars["charts/episodic_length"])
    assert all(0 < value <= 100 for _, value in scalars["metrics/ess_pct"])
    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["batch_size"] == 128 and args["num_iterations"] == 8 and args["gamma"] == 0.999
    expected = dict(iterations=8, global_step=1024, metric_iterations=[2, 4, 6, 8], embedding_rows=40, feature_dim=256)
    checkpoint = check_run_artifacts(run_dir, "ppo_procgen", **expected, tracked="fake")
    assert checkpoint["return_rms"]["count"].item() > 1  # the reward statistics travel with the model


def test_seeded_runs_are_reproducible_and_separate_networks_log_critic_rank(monkeypatch, tmp_path):
    """Two seeded runs in one process: what the first leaves behind (torch's RNG, EnvPool) must not change the second."""
    logged = []
    for name in ("a", "b"):
        flags = [*TINY, "--total-timesteps", "256", "--separate-networks", "--seed", "3"]
        run_main(monkeypatch, ppo_procgen, [*flags, "--runs-dir", str(tmp_path / name)])
        logged.append(read_scalars(only_run_dir(tmp_path / name)))
    for tag in ("losses/value_loss", "losses/policy_loss", "metrics/grad_kurtosis"):
        assert logged[0][tag] == logged[1][tag], tag
    assert "metrics/feature_rank_critic" in logged[0]


def test_compiled_and_nchw_paths_log_the_losses_of_the_default_path(monkeypatch, tmp_path):
    """--compile (torch.compile of acting and of the update) and --no-channels-last (CleanRL's layout) change how
    the same maths runs, not what is learned: on a fixed seed the losses agree up to float rounding."""
    # 3 iterations of 1 minibatch per epoch: with TINY's 2, the rounding drift of the value loss by the 4th reached 0.2 %
    flags = [*TINY, "--total-timesteps", "384", "--num-minibatches", "1", "--torch-threads", "1"]
    variants = {"compiled": ["--compile"], "nchw": ["--no-channels-last"]}
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl")
    check_same_losses(monkeypatch, tmp_path, ppo_procgen, flags, variants, tags, compile_backend="aot_eager")


def test_bf16_logs_the_losses_of_fp32_within_measured_tolerances_and_resumes_either_way(monkeypatch, tmp_path):
    flags = [*TINY, "--total-timesteps", "384", "--num-minibatches", "1", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/policy_loss", "losses/entropy", "losses/approx_kl", "losses/value_loss")
    check_bf16(monkeypatch, tmp_path, ppo_procgen, flags, tags)


def assert_planted_statistics_continued(stats: dict, resumed_steps: int) -> None:
    """The return normaliser counts the real transitions of the resumed steps only: at most all of them, at least half
    (a reset step, left out, follows a real step that ended an episode). The new returns (a few tens at most) weigh
    under 0.3 % against the planted count: the mean stays within 1 of the planted 100, not near a fresh run's."""
    assert PLANTED["count"] + resumed_steps / 2 <= stats["count"].item() <= PLANTED["count"] + resumed_steps
    assert abs(stats["mean"].item() - PLANTED["mean"]) < 1.0


def test_sigterm_checkpoints_and_resume_reaches_the_same_total(monkeypatch, tmp_path):
    """In-process, SIGTERM after the first iteration (a real signal to real processes: the torchrun test)."""
    flags = [*TINY, "--runs-dir", str(tmp_path)]
    flags[flags.index("--total-timesteps") + 1] = "384"  # 3 iterations
    stop_after_first_checkpoint(monkeypatch, ppo_procgen, flags)
    checkpoint_path = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    interrupted = torch.load(checkpoint_path, weights_only=True)
    assert (interrupted["iteration"], interrupted["global_step"]) == (1, 128)
    plant_statistics(checkpoint_path, "return_rms")

    run_main(monkeypatch, ppo_procgen, ["--resume", checkpoint_path, "--checkpoint-interval", "1000"])
    final = torch.load(checkpoint_path, weights_only=True)
    assert_optimizer_went_on(final)
    assert final["iteration"] == 3 and final["global_step"] == 384
    # the statistics continued from the checkpoint's, not restarted: TINY's 4 envs x 32 steps per resumed iteration
    assert_planted_statistics_continued(final["return_rms"], 4 * 32 * 2)
    steps = [step for step, _ in read_scalars(only_run_dir(tmp_path))["charts/SPS"]]
    assert steps == [128, 256, 384]  # one run directory, no gap, no repeat


BAD_FLAGS = [
    (["--env-id", "Breakout-v5"], "is not an EnvPool Procgen task"),
    (["--env-id", "Bigfish"], "is not an EnvPool Procgen task"),
    (["--env-id", "Breakout"], "is not an EnvPool Procgen task"),
    (["--num-minibatches", "3", "--num-envs", "2", "--num-steps", "8"], "--num-minibatches 3 does not divide the batch"),
    (["--minibatch-size", "100"], "--minibatch-size 100 does not divide the batch (num_envs * num_steps = 16384)"),
    (["--minibatch-size", "0"], "--minibatch-size must be finite and > 0, got 0"),
    (["--num-envs", "0"], "--num-envs must be finite and > 0, got 0"),
    (["--reward-clip", "0"], "--reward-clip must be finite and > 0, got 0"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--num-levels", "-1"], "--num-levels must be finite and >= 0"),
    (["--start-level", "2147483648"], "--start-level must be below 2**31"),  # EnvPool's traceback
    (["--start-level", "2147483600", "--num-levels", "100"], "--start-level + --num-levels must stay under 2**31"),
    (["--start-level", "2147483000", "--num-levels", "1000"], "(the last level: 2,147,483,999)"),  # trained past it
    (["--total-timesteps", "100"], "smaller than one batch"),
    (["--resume", "/no/such/checkpoint.pt"], "no such checkpoint file"),
    (["--runs-dir", "/proc/forbidden"], "--runs-dir"),
    (["--torch-threads", "0"], "--torch-threads must be finite and > 0, got 0"),
    (["--seed", "-1"], "--seed -1, "),  # under torchrun Procgen draws the env seeds with RandomState, which takes none
    (["--seed", "2147483647"], "iterations: env seeds ("),
    (
        ["--seed", "2147482124", "--runs-dir", "/proc/forbidden"],
        "--seed 2147482124, 1,525 iterations: env seeds",
    ),  # 1,525 iterations: its last env seed is 2**31
    (["--torch-threads", "2147483648"], "--torch-threads must be below 2**31"),
    (["--torch-threads", str((os.cpu_count() or 1) + 1)], "CPUs here"),  # 100,000 threads: a segfault
    (["--cudagraphs"], "--cudagraphs needs --compile and CUDA"),
    (["--save-embeddings", "--metrics-interval", "0"], "--save-embeddings needs --metrics-interval > 0"),
    (["--compile", "--cudagraphs", "--no-cuda"], "--cudagraphs needs --compile and CUDA"),
]


@pytest.mark.parametrize("flags, fragment", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(ppo_procgen.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags])
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")


# (flags, what tyro's message must name): EnvPool's Procgen has no --max-episode-steps; a switch takes no value
TYRO_ERRORS = [(["--max-episode-steps", "100"], "--max-episode-steps"), (["--separate-networks", "maybe"], "maybe")]
TYRO_ERRORS += [(["--num-envs", "eight"], "--num-envs"), (["--lr-scaling", "cubic"], "--lr-scaling")]


@pytest.mark.parametrize("flags, name", TYRO_ERRORS)
def test_flags_tyro_rejects_exit_2_naming_the_flag(tmp_path, monkeypatch, capsys, flags, name):
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags]
    assert name in tyro_error(ppo_procgen.main, monkeypatch, capsys, argv)
    assert not os.path.exists(tmp_path / "runs")


def test_resume_rejects_a_file_that_is_not_a_checkpoint(tmp_path, monkeypatch, capsys):
    model_only = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(2)}, model_only)
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    other_script = tmp_path / "atari_checkpoint.pt"  # right keys, but another script's flags
    atari_args = {"env_id": "Breakout-v5", "max_episode_steps": 27_000}
    torch.save({"args": atari_args, "model": {}, "optimizer": {}, "iteration": 1, "rng": {}}, other_script)
    cases = (
        (model_only, "is not a checkpoint.pt"),
        (tmp_path / "junk.pt", "not a readable checkpoint"),
        (other_script, "is not a checkpoint.pt of ppo_procgen.py"),
    )
    for path, fragment in cases:
        assert fragment in usage_error(ppo_procgen.main, monkeypatch, capsys, [SCRIPT, "--resume", str(path)])


def test_missing_qt_runtime_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    def make_spec_without_qt(env_id):
        raise ImportError("EnvPool Procgen requires the system Qt 5 runtime on Linux.")

    monkeypatch.setattr(envpool, "make_spec", make_spec_without_qt)
    line = usage_error(ppo_procgen.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs")])
    assert "Qt 5 runtime" in line and "apt-get install -y libqt5gui5" in line


def test_a_bad_flag_from_the_shell(tmp_path):
    """The real command line: one line, exit 2 (tyro's refusals and the other checks: in-process, above)."""
    flags = ["--env-id", "Pong-v5"]
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and flags[0] in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


# --------------------------------------------------------------------------------------
# One run over several processes (torchrun, Gloo on the CPU)
# --------------------------------------------------------------------------------------

TORCHRUN_FLAGS = [*TINY, "--target-kl", "0.5"]


def reduction_worker(rank, init_file, leaves, data, out_path):
    """One of two processes: the PPO loss of its rows, then the gradient sum of all_ranks_sum_gradients."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rows = (slice(0, 4), slice(4, 7))[rank]
    parameters = [leaf.clone().requires_grad_() for leaf in leaves]  # the same weights in both processes
    minibatch = {name: values[rows] for name, values in data.items()}
    statistics = minibatch_statistics(minibatch)  # over both processes
    loss, stats = ppo_loss(*(p[rows] for p in parameters), minibatch, statistics, **LOSS_COEFFICIENTS)
    loss.backward()
    ppo_procgen.all_ranks_sum_gradients(parameters)
    summed_stats = {name: ppo_procgen.all_ranks_sum(value) for name, value in stats.items()}
    torch.save({"gradients": [p.grad for p in parameters], "stats": summed_stats}, f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def test_two_processes_with_different_reset_steps_get_exactly_the_single_process_gradient(tmp_path):
    """Rows 0-3 on process 0 (3 real transitions), rows 4-6 on process 1 (2): per-process means would weight
    them wrongly; the global-count shares summed over processes give the single-process loss and gradient."""
    generator = torch.Generator().manual_seed(0)
    data = {k: torch.randn(7, generator=generator) for k in ("logprobs", "values", "advantages", "returns")}
    data["valid"] = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    leaves = [torch.randn(7, generator=generator) * 0.1 for _ in range(3)]  # new log-prob, value, entropy
    whole = [leaf.clone().requires_grad_() for leaf in leaves]
    loss, stats = ppo_loss(*whole, data, minibatch_statistics(data), **LOSS_COEFFICIENTS)
    loss.backward()
    torch.multiprocessing.spawn(reduction_worker, args=(tmp_path / "init", leaves, data, tmp_path / "out.pt"), nprocs=2)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"out.pt.{rank}", weights_only=True)
        for whole_parameter, gradient in zip(whole, result["gradients"], strict=True):
            assert torch.allclose(gradient, whole_parameter.grad, atol=1e-6)
        for name, value in stats.items():
            assert result["stats"][name].item() == pytest.approx(value.item(), abs=1e-6), name


def normaliser_worker(rank, init_file, batches, weights, out_path):
    """One of two processes: RunningMeanStd updates with its half of each step's envs."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rms, envs = RunningMeanStd(), (slice(0, 3), slice(3, 6))[rank]
    for batch, weight in zip(batches, weights, strict=True):
        rms.update(batch[envs], weight[envs])
    torch.save(rms.state_dict(), f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def test_two_processes_update_the_reward_normaliser_like_one_process_on_all_envs(tmp_path):
    """Each process holds 3 of 6 envs with its own reset steps: the merged moments of both equal one process's
    update on all 6, so every process scales rewards alike (and process 0's checkpoint describes all)."""
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(6, generator=generator, dtype=torch.float64) * 3 + 2 for _ in range(4)]
    weights = [(torch.rand(6, generator=generator) > 0.3).double() for _ in range(4)]
    weights[0] = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # process 1: all reset steps
    whole = RunningMeanStd()
    for batch, weight in zip(batches, weights, strict=True):
        whole.update(batch, weight)
    torch.multiprocessing.spawn(normaliser_worker, args=(tmp_path / "init", batches, weights, tmp_path / "rms"), nprocs=2)
    states = [torch.load(tmp_path / f"rms.{rank}", weights_only=True) for rank in (0, 1)]
    for name, value in whole.state_dict().items():
        assert torch.equal(states[0][name], states[1][name]), name  # bit for bit the same on both processes
        torch.testing.assert_close(states[0][name], value, rtol=1e-12, atol=1e-12)


def joined(outputs):
    """Reset or step outputs of pools side by side: observations (rewards, ends) and level seeds, concatenated."""
    columns = zip(*([*output[:-1], output[-1]["level_seed"]] for output in outputs), strict=True)
    return [np.concatenate(column) for column in columns]


def test_envpool_seeds_env_i_with_the_i_th_draw_so_processes_split_one_process_envs():
    """What the script's torchrun env seeds rely on: EnvPool's Procgen seeds env i of `seed=s` with the i-th 32-bit
    draw of mt19937(s), so two pools given those draws, 2 each, step exactly the 4 envs (and levels) of one pool."""
    actions = np.random.default_rng(0).integers(0, 15, size=(150, 4)).astype(np.int32)
    for levels in ({}, {"num_levels": 3, "start_level": 5}):
        one = envpool.make("BigfishEasy-v0", env_type="gymnasium", num_envs=4, seed=7, **levels)
        draws = np.random.RandomState(7).randint(2**32, size=(2, 2), dtype=np.uint32)  # as main() does under torchrun
        seeds = [draws[rank].view(np.int32).tolist() for rank in (0, 1)]
        two = [envpool.make("BigfishEasy-v0", env_type="gymnasium", num_envs=2, seed=seed, **levels) for seed in seeds]
        for whole, split in zip(joined([one.reset()]), joined([pool.reset() for pool in two]), strict=True):
            assert np.array_equal(whole, split)
        for step_actions in actions:  # several episodes end and restart on the way
            split = joined([pool.step(half) for pool, half in zip(two, np.split(step_actions, 2), strict=True)])
            assert all(np.array_equal(a, b) for a, b in zip(joined([one.step(step_actions)]), split, strict=True))
        if levels:
            assert set(joined([one.step(actions[0])])[-1]) <= {5, 6, 7}


def test_torchrun_sigterm_checkpoints_once_and_resume_counts_steps_like_one_process_with_identical_weights(tmp_path):
    flags = [*TORCHRUN_FLAGS, "--runs-dir", str(tmp_path), "--save-model"]
    flags[flags.index("--total-timesteps") + 1] = "768"  # 6 iterations
    stdout = interrupt_with_sigterm(SCRIPT, flags, nproc=2)
    assert stdout.count("continue with --resume") == 1  # process 0 alone saves and says so
    run_dir = only_run_dir(tmp_path)  # process 0 alone writes
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert 1 <= checkpoint["iteration"] < 6 and checkpoint["global_step"] == 128 * checkpoint["iteration"]
    interrupted_at = plant_statistics(os.path.join(run_dir, "checkpoint.pt"), "return_rms")
    # --checkpoint-interval (a flag of how to run: not taken from the checkpoint) so that the finished run saves its state
    resume = ["--resume", os.path.join(run_dir, "checkpoint.pt"), "--checkpoint-interval", "1000", "--no-cuda"]
    result = run_torchrun(SCRIPT, 2, *resume)
    assert result.returncode == 0, result.stderr
    assert "weights identical on 2 of 2 processes" in result.stdout  # the reward statistics included
    done = json.load(open(os.path.join(run_dir, "done.json")))
    assert done == {"global_step": 768, "iterations": 6}  # one process's count of these flags
    scalars = read_scalars(run_dir)
    expected = PPO_TAGS | {"charts/normalized_return"}
    assert expected <= set(scalars), expected - set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [128 * i for i in range(1, 7)]
    lengths, normalized = scalars["charts/episodic_length"], scalars["charts/normalized_return"]
    assert len(normalized) == len(lengths) == len(scalars["charts/episodic_return"])  # every per-episode tag gathered
    # (that both processes' finished episodes are logged is checked on Isaac Gym's short ones: all_ranks_list is a copy)
    assert json.load(open(os.path.join(run_dir, "args.json")))["num_envs"] == 4  # the global N_envs
    assert os.path.exists(os.path.join(run_dir, "ppo_procgen.cleanrl_model"))  # --save-model kept on --resume
    # both processes resumed the checkpoint's statistics and summed their 2 envs' returns: 4 x 32 per iteration in all
    final = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert_planted_statistics_continued(final["return_rms"], 4 * 32 * (6 - interrupted_at))


def test_flags_that_do_not_split_over_the_torchrun_processes_exit_2_with_one_line(monkeypatch, capsys):
    line = refused_over_two_processes(ppo_procgen, monkeypatch, capsys, ppo_procgen.Args(num_envs=3, num_steps=16, cuda=False))
    assert line == "error: --num-envs 3 and the minibatch size 6 must split evenly over 2 processes"


def test_scale_rewards_clips_a_large_negative_reward():
    rms = ppo_procgen.RunningMeanStd()
    one, zero = torch.ones(1), torch.zeros(1)
    scaled, _ = ppo_procgen.scale_rewards(torch.tensor([-100.0]), one, zero, zero, rms, 0.99, 10.0)
    assert scaled.tolist() == [-10.0]  # -100 over a std of about 1 (one return of -100 at a count of 1e-4), clipped


def test_a_rollout_discarded_by_sigterm_leaves_the_normalisers_as_the_last_iteration_left_them(monkeypatch, tmp_path):
    argv = [*TINY, "--runs-dir", str(tmp_path)]
    check_a_discarded_rollout_leaves_the_normalisers(monkeypatch, ppo_procgen, argv, ["return_rms"])
