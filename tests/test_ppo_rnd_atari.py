"""ppo_rnd_atari.py: the RND maths on hand-made tensors, then end to end on a tiny CPU budget."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import (
    PPO_TAGS,
    check_run_artifacts,
    check_same_losses,
    interrupt_with_sigterm,
    only_run_dir,
    read_scalars,
    run_script,
    run_twice,
    tyro_error,
    usage_error,
)

import ppo_atari_envpool
import ppo_rnd_atari
from ppo_rnd_atari import (
    RNDModel,
    RunningMeanStd,
    compute_gae,
    compute_intrinsic_gae,
    normalise_frames,
    ppo_rnd_loss,
    reward_forward_filter,
)

SCRIPT = "ppo_rnd_atari.py"
RND_TAGS = PPO_TAGS | {"charts/intrinsic_reward", "losses/rnd_loss"}
# 2 envs x 16 steps, 8 iterations; Breakout with a 40-step limit ends games quickly; a
# one-rollout (16-step) observation-normalisation warm-up.
TINY_FLAGS = ["--no-cuda", "--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
              "--update-epochs", "1", "--total-timesteps", "256", "--num-iterations-obs-norm-init", "1",
              "--max-episode-steps", "40", "--metrics-interval", "2", "--metrics-batch", "24"]  # fmt: skip


def column(xs):
    return torch.tensor(xs, dtype=torch.float32)[:, None]  # (T, N=1)


# --------------------------------------------------------------------------------------
# Normalisers
# --------------------------------------------------------------------------------------


def test_running_mean_std_matches_numpy_over_the_concatenated_batches():
    generator = np.random.default_rng(0)
    batches = [generator.normal(3.0, 2.0, size=(n, 3)) for n in (1, 7, 50, 2, 13)]
    rms = RunningMeanStd((3,))
    for batch in batches:
        rms.update(torch.as_tensor(batch, dtype=torch.float32))
    everything = np.concatenate(batches)
    assert rms.count.item() == 73
    np.testing.assert_allclose(rms.mean.numpy(), everything.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(rms.var.numpy(), everything.var(axis=0), rtol=1e-5)  # population variance


def test_running_mean_std_chunks_uint8_frames_and_skips_empty_batches():
    frames = torch.randint(0, 256, (37, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    chunked, whole = RunningMeanStd((1, 4, 4)), RunningMeanStd((1, 4, 4))
    chunked.update(frames, chunk_size=5)  # 8 merges of at most 5 frames
    chunked.update(frames[:0])  # no frame: no change (a rollout step where every env resets)
    whole.update(frames.double())
    assert chunked.count.item() == 37
    torch.testing.assert_close(chunked.mean, whole.mean)
    torch.testing.assert_close(chunked.var, whole.var)
    torch.testing.assert_close(chunked.mean, frames.double().mean(dim=0))


def test_running_mean_std_state_round_trip():
    rms = RunningMeanStd((2,))
    rms.update(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
    restored = RunningMeanStd((2,))
    restored.load_state_dict(rms.state_dict())
    for key in ("mean", "var", "count"):
        assert torch.equal(getattr(restored, key), getattr(rms, key))
    assert restored.var.tolist() == [1.0, 4.0]


def test_normalise_frames_clips_and_survives_constant_pixels():
    rms = RunningMeanStd((1, 1, 2))
    rms.update(torch.tensor([[[[10, 0]]], [[[10, 4]]]], dtype=torch.uint8))  # pixel 0 constant, pixel 1: 2 +- 2
    out = normalise_frames(torch.tensor([[[[10, 4]]], [[[200, 255]]]], dtype=torch.uint8), rms)
    assert torch.isfinite(out).all()
    assert out[0].flatten().tolist() == pytest.approx([0.0, 1.0], abs=1e-6)  # (10-10)/~0 -> 0, (4-2)/2 = 1
    assert out[1].flatten().tolist() == [5.0, 5.0]  # clipped


def test_reward_forward_filter_on_a_hand_made_sequence():
    # env 0: rewards 1, 2, (reset step), 4 from a filter state of 0; env 1: no reward, state 10.
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [9.0, 0.0], [4.0, 0.0]])
    valid = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    filtered, state = reward_forward_filter(rewards, valid, torch.tensor([0.0, 10.0]), gamma=0.5)
    # env 0: 1; 0.5*1 + 2 = 2.5; reset step: unchanged 2.5; 0.5*2.5 + 4 = 5.25
    # env 1: 0.5*10 = 5, 2.5, 1.25, 0.625 (never restarted: non-episodic)
    assert filtered[:, 0].tolist() == [1.0, 2.5, 2.5, 5.25]
    assert filtered[:, 1].tolist() == [5.0, 2.5, 1.25, 0.625]
    assert state.tolist() == [5.25, 0.625]


# --------------------------------------------------------------------------------------
# Advantages and loss
# --------------------------------------------------------------------------------------


def test_intrinsic_gae_runs_through_a_termination_and_skips_the_reset_step():
    # t=1 ends the episode (terminal), t=2 is EnvPool's reset step, t=3 a new episode.
    rewards, values, valid = [1, 2, 0, 3], [0.5, 1.0, 4.0, 2.0], [1, 1, 0, 1]
    gamma = lam = 0.5
    advantages, returns = compute_intrinsic_gae(column(rewards), column(values), column(valid), torch.tensor([1.0]),
                                                gamma, lam)  # fmt: skip
    # t=3: 3 + 0.5*1 - 2 = 1.5
    # t=2: reset step: advantage 0; skipped (the chain carries V(s_3) = 2 and A_3 = 1.5 past it)
    # t=1: no cut at the termination: delta = 2 + 0.5*V(s_3) - 1 = 2; A = 2 + 0.25*1.5 = 2.375
    # t=0: delta = 1 + 0.5*1 - 0.5 = 1; A = 1 + 0.25*2.375 = 1.59375
    assert advantages[:, 0].tolist() == pytest.approx([1.59375, 2.375, 0.0, 1.5])
    assert returns[:, 0].tolist() == pytest.approx([2.09375, 3.375, 4.0, 3.5])

    # The extrinsic GAE of the same rollout is episodic: the chain stops at the termination.
    episodic, _ = compute_gae(column(rewards), column(values), column([0, 1, 0, 0]), column([0, 0, 0, 0]),
                              column(valid), torch.tensor([1.0]), gamma, lam)  # fmt: skip
    assert episodic[:, 0].tolist() == pytest.approx([1.25, 1.0, 0.0, 1.5])


def test_intrinsic_gae_without_reset_steps_is_plain_gae():
    rewards, values = column([1, 0, 2, 1]), column([0.3, 0.1, 0.7, 0.2])
    ones, zeros = column([1, 1, 1, 1]), column([0, 0, 0, 0])
    intrinsic, _ = compute_intrinsic_gae(rewards, values, ones, torch.tensor([0.4]), 0.9, 0.8)
    plain, _ = compute_gae(rewards, values, zeros, zeros, ones, torch.tensor([0.4]), 0.9, 0.8)
    torch.testing.assert_close(intrinsic, plain)


def test_intrinsic_gae_reset_step_in_the_last_row_bootstraps_from_next_value():
    # t=0 terminates inside the rollout, t=1 (last row) is the reset step: t=0 bootstraps from next_value.
    advantages, _ = compute_intrinsic_gae(column([1, 0]), column([0.5, 9.0]), column([1, 0]), torch.tensor([2.0]),
                                          0.5, 0.5)  # fmt: skip
    # t=0: 1 + 0.5*2 - 0.5 = 1.5
    assert advantages[:, 0].tolist() == pytest.approx([1.5, 0.0])


def rnd_loss_args(**overrides):
    base = dict(new_logprob=torch.zeros(2), old_logprob=torch.zeros(2), advantages=torch.tensor([1.0, -2.0]),
                new_ext_value=torch.tensor([1.0, 2.0]), old_ext_value=torch.tensor([1.0, 2.0]),
                ext_returns=torch.zeros(2), new_int_value=torch.zeros(2), old_int_value=torch.zeros(2),
                int_returns=torch.zeros(2), entropy=torch.tensor([0.5, 1.5]), prediction_error=torch.zeros(2),
                mask=torch.ones(2), rnd_mask=torch.ones(2), clip_coef=0.2, clip_vloss=False, ent_coef=0.01, vf_coef=0.5,
                norm_adv=False)  # fmt: skip
    return {**base, **overrides}


def call_ppo_rnd_loss(new_logprob, old_logprob, advantages, new_ext_value, old_ext_value, ext_returns, new_int_value,
                      old_int_value, int_returns, entropy, prediction_error, mask, rnd_mask, **coefficients):  # fmt: skip
    minibatch = {"logprobs": old_logprob, "advantages": advantages, "ext_values": old_ext_value, "ext_returns": ext_returns,
                 "int_values": old_int_value, "int_returns": int_returns, "valid": mask, "rnd_mask": rnd_mask}  # fmt: skip
    return ppo_rnd_loss(new_logprob, new_ext_value, new_int_value, entropy, prediction_error, minibatch, **coefficients)


def test_loss_reduces_to_ppo_without_intrinsic_terms():
    args = rnd_loss_args(new_logprob=torch.tensor([0.1, -0.3]), new_ext_value=torch.tensor([1.5, 2.0]),
                         clip_vloss=True, norm_adv=True)  # fmt: skip
    loss, stats = call_ppo_rnd_loss(**args)
    minibatch = {"logprobs": args["old_logprob"], "values": args["old_ext_value"], "advantages": args["advantages"],
                 "returns": args["ext_returns"], "valid": args["mask"]}  # fmt: skip
    minibatch |= ppo_atari_envpool.minibatch_statistics(minibatch)
    ppo, ppo_stats = ppo_atari_envpool.ppo_loss(args["new_logprob"], args["new_ext_value"], args["entropy"], minibatch,
                                                clip_coef=0.2, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=True)  # fmt: skip
    assert loss.item() == pytest.approx(ppo.item())
    for name in ppo_stats:
        assert stats[name].item() == pytest.approx(ppo_stats[name].item()), name
    assert stats["rnd_loss"].item() == 0.0


def blank_loss_args(n, **overrides):
    """n states with zero advantages, values, returns and entropy, all real; flags as rnd_loss_args."""
    zeros = torch.zeros(n)
    base = dict(new_logprob=zeros, old_logprob=zeros, advantages=zeros, new_ext_value=zeros, old_ext_value=zeros,
                ext_returns=zeros, new_int_value=zeros, old_int_value=zeros, int_returns=zeros, entropy=zeros,
                prediction_error=zeros, mask=torch.ones(n), rnd_mask=torch.ones(n))  # fmt: skip
    return rnd_loss_args(**{**base, **overrides})


def test_loss_sums_value_losses_and_adds_the_masked_predictor_loss():
    prediction_error = torch.tensor([1.0, 2.0, 4.5])
    args = blank_loss_args(3, new_ext_value=torch.tensor([1.0, 0.0, 0.0]), old_ext_value=torch.tensor([1.0, 0.0, 0.0]),
                           new_int_value=torch.tensor([0.0, 2.0, 5.0]), old_int_value=torch.tensor([0.0, 2.0, 5.0]),
                           prediction_error=prediction_error, mask=torch.tensor([1.0, 1.0, 0.0]),
                           rnd_mask=torch.tensor([0.0, 1.0, 1.0]))  # fmt: skip
    loss, stats = call_ppo_rnd_loss(**args)
    # entry 2 is a reset step (mask 0): it counts nowhere. ext: 0.5 * mean(1, 0) = 0.25; int: 0.5 * mean(0, 4) = 1
    assert stats["ext_value_loss"].item() == pytest.approx(0.25)
    assert stats["int_value_loss"].item() == pytest.approx(1.0)
    assert stats["value_loss"].item() == pytest.approx(1.25)
    # predictor loss over the entries with mask and rnd_mask: entry 1 only -> 2
    assert stats["rnd_loss"].item() == pytest.approx(2.0)
    assert loss.item() == pytest.approx(0.5 * 1.25 + 2.0)


def test_rnd_error_is_the_mean_squared_feature_error_and_only_the_predictor_learns_it():
    torch.manual_seed(0)
    rnd = RNDModel()
    frames = torch.randn(3, 1, 84, 84)
    predicted, target = rnd.predictor(frames), rnd.target(frames)
    assert predicted.shape == target.shape == (3, 512)
    error = rnd(frames)
    torch.testing.assert_close(error, ((predicted - target) ** 2).sum(dim=1) / 512)
    loss, stats = call_ppo_rnd_loss(**blank_loss_args(3, prediction_error=error))
    assert stats["rnd_loss"].item() == pytest.approx(error.mean().item())
    assert stats["rnd_loss"].item() > 0
    loss.backward()
    assert all(p.grad is None for p in rnd.target.parameters())
    assert all(p.grad is not None for p in rnd.predictor.parameters())


# --------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded_runs(tmp_path_factory):
    """Two tiny runs with --separate-networks --seed 3, the first also with every artifact flag (which add files, not
    randomness): the tiny-run test reads the first, the reproducibility test compares both."""
    artifacts = ["--checkpoint-interval", "3", "--save-model", "--save-embeddings", "--embeddings-per-iteration", "10",
                 "--capture-video"]  # fmt: skip
    return run_twice(SCRIPT, tmp_path_factory.mktemp("seeded"), [*TINY_FLAGS, "--separate-networks", "--seed", "3"], artifacts)


def test_tiny_run_writes_every_tag_and_artifact(seeded_runs):
    result, run_dir = seeded_runs[0]
    assert "warm-up: 32 random-action steps" in result.stdout
    assert os.path.basename(run_dir).startswith("Breakout-v5__ppo_rnd_atari__3__")

    scalars = read_scalars(run_dir)
    assert RND_TAGS <= set(scalars), RND_TAGS - set(scalars)
    # 256 steps / 32 per iteration = 8 iterations (the warm-up is not counted), metrics on 2, 4, 6, 8
    assert [step for step, _ in scalars["charts/SPS"]] == [32 * i for i in range(1, 9)]
    assert [step for step, _ in scalars["charts/intrinsic_reward"]] == [32 * i for i in range(1, 9)]
    assert [step for step, _ in scalars["metrics/feature_rank"]] == [64, 128, 192, 256]
    for tag in RND_TAGS - {"losses/explained_variance"}:
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag
    assert all(value > 0 for _, value in scalars["charts/intrinsic_reward"])
    assert all(value > 0 for _, value in scalars["losses/rnd_loss"])
    returns = [value for _, value in scalars["charts/episodic_return"]]
    assert all(value >= 0 for value in returns) and len(returns) >= 2

    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["batch_size"] == 32 and args["minibatch_size"] == 16 and args["num_iterations"] == 8
    assert args["repeat_action_probability"] == 0.25 and args["int_gamma"] == 0.99

    checkpoint = check_run_artifacts(
        run_dir, "ppo_rnd_atari", iterations=8, global_step=256, metric_iterations=[2, 4, 6, 8], embedding_rows=40
    )
    assert checkpoint["warmup_steps"] == 16
    obs_stats = checkpoint["obs_rms"]
    assert obs_stats["mean"].shape == obs_stats["var"].shape == (1, 84, 84)
    # last frames of the next observations of real transitions: warm-up 32 + training 256, minus reset steps
    assert 200 < obs_stats["count"].item() <= 32 + 256
    assert 0 < obs_stats["mean"].mean().item() < 255 and obs_stats["var"].max().item() > 0
    int_stats = checkpoint["int_return_rms"]
    assert 200 < int_stats["count"].item() <= 256 and int_stats["var"].item() > 0
    assert checkpoint["int_return_filter"].shape == (2,)
    assert {key.split(".")[0] for key in checkpoint["rnd"]} == {"target", "predictor"}
    model = torch.load(os.path.join(run_dir, "ppo_rnd_atari.cleanrl_model"), weights_only=True)
    assert set(model) == set(checkpoint["model"]) and {"critic_ext.weight", "critic_int.weight"} <= set(model)

    assert np.load(os.path.join(run_dir, "embeddings.npz"))["int_values"].shape == (40,)


def test_seeded_runs_are_reproducible_with_separate_networks(seeded_runs):
    logged = [read_scalars(run_dir) for _, run_dir in seeded_runs]
    for tag in ("losses/value_loss", "losses/rnd_loss", "charts/intrinsic_reward", "metrics/grad_kurtosis"):
        assert logged[0][tag] == logged[1][tag], tag
    assert "metrics/feature_rank_critic" in logged[0]


def test_compiled_path_logs_the_losses_of_the_default_path(monkeypatch, tmp_path):
    """--compile (torch.compile of acting and of the update) changes how the same maths runs, not what is learned:
    on a fixed seed the losses agree up to float rounding (--no-channels-last: in the PPO and Procgen tests)."""
    flags = [*TINY_FLAGS, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    check_same_losses(monkeypatch, tmp_path, ppo_rnd_atari, flags, {"compiled": ["--compile"]},
                      ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/rnd_loss"), compile_backend="aot_eager")  # fmt: skip


def test_sigterm_checkpoints_and_resume_keeps_the_normalisers(tmp_path):
    flags = [*TINY_FLAGS, "--runs-dir", str(tmp_path)]
    flags[flags.index("--total-timesteps") + 1] = "1280"  # 40 iterations: long enough to interrupt
    interrupt_with_sigterm(SCRIPT, flags)  # once the first checkpoint.pt (after iteration 1) exists
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    interrupted_at = checkpoint["iteration"]
    assert 1 <= interrupted_at < 40 and checkpoint["global_step"] == 32 * interrupted_at
    assert checkpoint["warmup_steps"] == 16 and checkpoint["obs_rms"]["count"].item() > 0

    # Plant recognisable statistics: after the resume they must still be there, grown only by
    # the resumed iterations' frames (no new warm-up, no fresh normaliser).
    planted = 1e6
    checkpoint["obs_rms"] = {"mean": torch.full((1, 84, 84), 100.0, dtype=torch.float64),
                             "var": torch.full((1, 84, 84), 400.0, dtype=torch.float64),
                             "count": torch.tensor(planted, dtype=torch.float64)}  # fmt: skip
    checkpoint["int_return_rms"]["count"] = torch.tensor(planted, dtype=torch.float64)
    torch.save(checkpoint, checkpoint_path)

    result = run_script(SCRIPT, "--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda")
    assert result.returncode == 0, result.stderr
    assert "warm-up" not in result.stdout
    assert only_run_dir(tmp_path) == run_dir  # same run directory
    final = torch.load(checkpoint_path, weights_only=True)
    assert final["iteration"] == 40 and final["global_step"] == 1280
    resumed_frames = 32 * (40 - interrupted_at)
    obs_stats = final["obs_rms"]
    assert planted < obs_stats["count"].item() <= planted + resumed_frames
    assert abs(obs_stats["mean"].mean().item() - 100.0) < 1.0  # new frames weigh < 0.13 %
    assert planted < final["int_return_rms"]["count"].item() <= planted + resumed_frames
    steps = [step for step, _ in read_scalars(run_dir)["charts/SPS"]]
    assert steps == [32 * i for i in range(1, 41)]  # every iteration logged exactly once, up to the total


def test_sigterm_during_the_warm_up_resumes_the_warm_up(tmp_path):
    flags = [*TINY_FLAGS, "--runs-dir", str(tmp_path), "--num-iterations-obs-norm-init", "100000"]
    interrupt_with_sigterm(SCRIPT, flags, "observation-normalisation warm-up")
    checkpoint_path = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["iteration"] == 0 and checkpoint["global_step"] == 0
    assert 0 <= checkpoint["warmup_steps"] < 1_600_000
    assert checkpoint["obs_rms"]["count"].item() <= 2 * checkpoint["warmup_steps"]

    # Pretend most of the warm-up was done: the resumed run finishes the last 5 steps, then trains.
    checkpoint["warmup_steps"] = 1_600_000 - 5
    torch.save(checkpoint, checkpoint_path)
    result = run_script(SCRIPT, "--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda")
    assert result.returncode == 0, result.stderr
    assert "warm-up: 10 random-action steps" in result.stdout
    final = torch.load(checkpoint_path, weights_only=True)
    assert final["iteration"] == 8 and final["global_step"] == 256 and final["warmup_steps"] == 1_600_000


# --------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------

BAD_FLAGS = [
    (["--num-envs", "0"], "--num-envs must be > 0, got 0"),
    (["--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch (num_envs * num_steps = 16384)"),
    (["--minibatch-size", "20000"], "--minibatch-size 20000 does not divide the batch"),
    (["--minibatch-size", "0"], "--minibatch-size must be > 0"),
    (["--total-timesteps", "100"], "smaller than one batch"),
    (["--env-id", "NoSuchGame-v5"], "not an EnvPool Atari task"),
    (["--env-id", "BigfishEasy-v0"], "not an EnvPool Atari task"),
    (["--learning-rate", "0"], "--learning-rate must be > 0"),
    (["--int-coef", "-1"], "--int-coef must be >= 0"),
    (["--ext-coef", "-0.5"], "--ext-coef must be >= 0"),
    (["--int-gamma", "1.5"], "--int-gamma must be in [0, 1]"),
    (["--repeat-action-probability", "2"], "--repeat-action-probability must be in [0, 1]"),
    (["--update-proportion", "0"], "--update-proportion must be in (0, 1]"),
    (["--num-iterations-obs-norm-init", "-1"], "--num-iterations-obs-norm-init must be >= 0"),
    (["--resume", "/no/such/checkpoint.pt"], "no such checkpoint file"),
    (["--runs-dir", "/proc/forbidden"], "--runs-dir"),
    (["--torch-threads", "0"], "--torch-threads must be > 0, got 0"),
    (["--cudagraphs"], "--cudagraphs needs --compile and CUDA"),
    (["--compile", "--cudagraphs", "--no-cuda"], "--cudagraphs needs --compile and CUDA"),
]


@pytest.mark.parametrize("flags, fragment", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(ppo_rnd_atari.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags])
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")  # nothing was created


@pytest.mark.parametrize("flags", [["--num-envs", "eight"], ["--lr-scaling", "cubic"], ["--no-such-flag", "1"]])
def test_flags_tyro_rejects_exit_2_naming_the_flag(tmp_path, monkeypatch, capsys, flags):
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags]
    assert flags[0] in tyro_error(ppo_rnd_atari.main, monkeypatch, capsys, argv)
    assert not os.path.exists(tmp_path / "runs")


def test_resume_rejects_a_ppo_checkpoint(tmp_path, monkeypatch, capsys):
    ppo_like = tmp_path / "checkpoint.pt"
    torch.save({"args": {}, "model": {}, "optimizer": {}, "iteration": 1, "global_step": 32, "rng": {}}, ppo_like)
    line = usage_error(ppo_rnd_atari.main, monkeypatch, capsys, [SCRIPT, "--resume", str(ppo_like)])
    assert "is not a checkpoint.pt of ppo_rnd_atari.py" in line


@pytest.mark.parametrize("flags", [["--update-proportion", "1.5"], ["--num-envs", "eight"]])
def test_bad_flags_from_the_shell(tmp_path, flags):
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and flags[0] in result.stderr, result.stderr
    if flags[0] != "--num-envs":  # our own checks print one line; tyro prints its own panel
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


def test_defaults_and_derived_values():
    args = ppo_rnd_atari.validate_and_derive(ppo_rnd_atari.Args(runs_dir="/tmp"))
    assert args.env_id == "MontezumaRevenge-v5" and args.repeat_action_probability == 0.25
    assert (args.num_envs, args.num_steps, args.batch_size, args.minibatch_size) == (128, 128, 16384, 4096)
    assert (args.gamma, args.int_gamma, args.ext_coef, args.int_coef) == (0.999, 0.99, 2.0, 1.0)
    assert args.scaled_learning_rate == pytest.approx(1e-4) and args.num_iterations == 10_000_000 // 16384
    args = ppo_rnd_atari.validate_and_derive(
        ppo_rnd_atari.Args(num_envs=512, num_steps=32, minibatch_size=2048, lr_scaling="sqrt", runs_dir="/tmp")
    )
    assert args.num_minibatches == 8 and args.scaled_learning_rate == pytest.approx(2e-4)  # k = 512 / 128 = 4
