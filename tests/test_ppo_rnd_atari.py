"""ppo_rnd_atari.py: the RND maths on hand-made tensors, then end to end on a tiny CPU budget."""

import json
import os
import signal

import numpy as np
import pytest
import torch
from conftest import (
    PPO_TAGS,
    assert_optimizer_went_on,
    check_bf16,
    check_life_lost_on_the_time_limit,
    check_run_artifacts,
    check_same_losses,
    fake_wandb,
    interrupt_with_sigterm,
    one_reward_per_step,
    only_run_dir,
    read_scalars,
    run_main,
    run_script,
    run_twice,
    tyro_error,
    usage_error,
)

import metrics
import ppo_atari_envpool
import ppo_rnd_atari
from ppo_rnd_atari import (
    RNDModel,
    RunningMeanStd,
    compute_gae,
    compute_gradients,
    compute_intrinsic_gae,
    masked_mean,
    minibatch_statistics,
    normalise_frames,
    ppo_rnd_loss,
    reward_forward_filter,
    update_frame_statistics,
)

SCRIPT = "ppo_rnd_atari.py"
RND_TAGS = PPO_TAGS | {"charts/intrinsic_reward", "losses/rnd_loss"}
# 2 envs x 16 steps, 8 iterations; Breakout with a 40-step limit ends games quickly; a
# one-rollout (16-step) observation-normalisation warm-up.
TINY_FLAGS = (
    "--no-cuda --env-id Breakout-v5 --num-envs 2 --num-steps 16 --num-minibatches 2 --update-epochs 1 --total-timesteps 256 "
)
TINY_FLAGS = (
    TINY_FLAGS + "--num-iterations-obs-norm-init 1 --max-episode-steps 40 --metrics-interval 2 --metrics-batch 24"
).split()


def column(xs):
    return torch.tensor(xs, dtype=torch.float32)[:, None]  # (T, N=1)


# --------------------------------------------------------------------------------------
# Normalisers
# --------------------------------------------------------------------------------------


def test_running_mean_std_counts_from_1e_4_as_cleanrl_rnd_and_baselines():
    """The chosen behaviour (ppo_isaacgym.RunningMeanStd, CleanRL's RND, OpenAI baselines): the statistics start as
    a prior of count 1e-4 with mean 0 and variance 1, which the first batch all but replaces."""
    rms = RunningMeanStd()
    assert (rms.count.item(), rms.mean.item(), rms.var.item()) == (1e-4, 0.0, 1.0)
    rms.update(torch.tensor([2.0, 4.0]))
    total = 2 + 1e-4
    assert rms.count.item() == pytest.approx(total, abs=1e-12)
    assert rms.mean.item() == pytest.approx(3.0 * 2 / total, abs=1e-12)
    assert rms.var.item() == pytest.approx((1e-4 * 1.0 + 2 * 1.0 + 9.0 * 1e-4 * 2 / total) / total, abs=1e-12)


def test_running_mean_std_matches_numpy_over_the_concatenated_batches():
    generator = np.random.default_rng(0)
    batches = [generator.normal(3.0, 2.0, size=(n, 3)) for n in (1, 7, 50, 2, 13)]
    rms = RunningMeanStd((3,))
    for batch in batches:
        rms.update(torch.as_tensor(batch, dtype=torch.float32))
    everything = np.concatenate(batches)
    assert rms.count.item() == pytest.approx(73 + 1e-4)
    np.testing.assert_allclose(rms.mean.numpy(), everything.mean(axis=0), rtol=1e-5)  # the prior weighs 1e-4 / 73
    np.testing.assert_allclose(rms.var.numpy(), everything.var(axis=0), rtol=1e-5)  # population variance


def test_frame_statistics_update_chunk_by_chunk_and_leave_out_reset_steps():
    frames = torch.randint(0, 256, (37, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    valid = torch.ones(37)
    valid[[3, 11, 30]] = 0.0  # reset steps: not counted
    chunked, whole = RunningMeanStd((1, 4, 4)), RunningMeanStd((1, 4, 4))
    update_frame_statistics(chunked, frames, valid, chunk=5)  # 8 merges of at most 5 frames
    update_frame_statistics(chunked, frames[:4], torch.zeros(4))  # a step where every env resets: no change
    whole.update(frames[valid.bool()].double())
    assert chunked.count.item() == pytest.approx(34 + 1e-4)
    torch.testing.assert_close(chunked.mean, whole.mean)
    torch.testing.assert_close(chunked.var, whole.var)
    torch.testing.assert_close(chunked.mean, frames[valid.bool()].double().mean(dim=0), rtol=1e-5, atol=0)


def test_running_mean_std_state_round_trip():
    rms = RunningMeanStd((2,))
    rms.update(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
    restored = RunningMeanStd((2,))
    restored.load_state_dict(rms.state_dict())
    for key in ("mean", "var", "count"):
        assert torch.equal(getattr(restored, key), getattr(rms, key))
    assert restored.var.tolist() == pytest.approx([1.0, 4.0], rel=1e-3)


def test_normalise_frames_clips_and_survives_constant_pixels():
    rms = RunningMeanStd((1, 1, 2))
    rms.update(torch.tensor([[[[10, 0]]], [[[10, 4]]]], dtype=torch.uint8))  # pixel 0 constant, pixel 1: 2 +- 2
    out = normalise_frames(torch.tensor([[[[10, 4]]], [[[200, 255]]]], dtype=torch.uint8), rms)
    assert torch.isfinite(out).all()
    # (10 - 10) / ~0.07 -> ~0 (the 1e-4 prior leaves a variance of ~0.005), (4 - 2) / 2 = 1
    assert out[0].flatten().tolist() == pytest.approx([0.0, 1.0], abs=1e-2)
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


def test_intrinsic_gae_bootstraps_through_a_termination_and_skips_the_reset_step():
    # t=1 ends the episode (terminal), t=2 is EnvPool's reset step (its row holds the terminal frame), t=3 a new episode.
    rewards, values, valid = [1, 2, 0, 3], [0.5, 1.0, 4.0, 2.0], [1, 1, 0, 1]
    gamma = lam = 0.5
    advantages, returns = compute_intrinsic_gae(
        column(rewards), column(values), column(valid), torch.tensor([1.0]), gamma, lam
    )
    # t=3: 3 + 0.5*1 - 2 = 1.5
    # t=2: reset step: advantage 0; the lambda-chain stops there
    # t=1: no termination: it bootstraps from the terminal frame's value, 2 + 0.5*V(s_2) - 1 = 3
    # t=0: delta = 1 + 0.5*1 - 0.5 = 1; A = 1 + 0.25*3 = 1.75
    assert advantages[:, 0].tolist() == pytest.approx([1.75, 3.0, 0.0, 1.5])
    assert returns[:, 0].tolist() == pytest.approx([2.25, 4.0, 4.0, 3.5])

    # The extrinsic GAE of the same rollout is episodic: the chain stops at the termination.
    episode_ends = column([0, 1, 0, 0]), column([0, 0, 0, 0])
    episodic, _ = compute_gae(column(rewards), column(values), *episode_ends, column(valid), torch.tensor([1.0]), gamma, lam)
    assert episodic[:, 0].tolist() == pytest.approx([1.25, 1.0, 0.0, 1.5])


def test_intrinsic_gae_without_reset_steps_is_plain_gae():
    rewards, values = column([1, 0, 2, 1]), column([0.3, 0.1, 0.7, 0.2])
    ones, zeros = column([1, 1, 1, 1]), column([0, 0, 0, 0])
    intrinsic, _ = compute_intrinsic_gae(rewards, values, ones, torch.tensor([0.4]), 0.9, 0.8)
    plain, _ = compute_gae(rewards, values, zeros, zeros, ones, torch.tensor([0.4]), 0.9, 0.8)
    torch.testing.assert_close(intrinsic, plain)


def test_intrinsic_gae_bootstraps_an_episode_end_from_its_last_frame_inside_the_rollout_as_on_its_last_step():
    """One rule for the episode's last transition (s_0 -> terminal frame, intrinsic reward 1), wherever the rollout ends:
    it bootstraps from the terminal frame's value, 9 (the next episode's first frame is worth 2)."""
    # Inside: row 1 is the reset step, whose row holds the terminal frame; row 2 the next episode's first frame
    inside, _ = compute_intrinsic_gae(
        column([1, 0, 0]), column([0.5, 9.0, 2.0]), column([1, 0, 1]), torch.tensor([0.0]), 0.5, 0.5
    )
    # On the last row: the observation after the rollout is the terminal frame
    last, _ = compute_intrinsic_gae(column([1]), column([0.5]), column([1]), torch.tensor([9.0]), 0.5, 0.5)
    assert inside[0, 0].item() == last[0, 0].item() == pytest.approx(1 + 0.5 * 9.0 - 0.5)


def rnd_loss_args(**overrides):
    base = dict(new_logprob=torch.zeros(2), old_logprob=torch.zeros(2), advantages=torch.tensor([1.0, -2.0]))
    base |= dict(new_ext_value=torch.tensor([1.0, 2.0]), old_ext_value=torch.tensor([1.0, 2.0]), ext_returns=torch.zeros(2))
    base |= dict(new_int_value=torch.zeros(2), old_int_value=torch.zeros(2), int_returns=torch.zeros(2))
    base |= dict(entropy=torch.tensor([0.5, 1.5]), prediction_error=torch.zeros(2), mask=torch.ones(2), rnd_mask=torch.ones(2))
    base |= dict(clip_coef=0.2, clip_vloss=False, ent_coef=0.01, vf_coef=0.5, norm_adv=False)
    return {**base, **overrides}


MINIBATCH_ARGS = (
    "old_logprob",
    "advantages",
    "old_ext_value",
    "ext_returns",
    "old_int_value",
    "int_returns",
    "mask",
    "rnd_mask",
)


def rnd_minibatch(old_logprob, advantages, old_ext_value, ext_returns, old_int_value, int_returns, mask, rnd_mask):
    minibatch = {"logprobs": old_logprob, "advantages": advantages, "ext_values": old_ext_value, "ext_returns": ext_returns}
    return minibatch | {"int_values": old_int_value, "int_returns": int_returns, "valid": mask, "rnd_mask": rnd_mask}


def rnd_statistics(minibatch):
    """minibatch_statistics and the predictor loss's count, as the update loop computes them."""
    statistics = minibatch_statistics(minibatch)
    return statistics | {"rnd_count": (minibatch["rnd_mask"] * minibatch["valid"]).sum().clamp(min=1.0)}


def call_ppo_rnd_loss(new_logprob, new_ext_value, new_int_value, entropy, prediction_error, **rest):
    minibatch = rnd_minibatch(**{name: rest.pop(name) for name in MINIBATCH_ARGS})
    outputs = (new_logprob, (new_ext_value, new_int_value), entropy, prediction_error)
    return ppo_rnd_loss(*outputs, minibatch, rnd_statistics(minibatch), **rest)


def test_loss_reduces_to_ppo_without_intrinsic_terms():
    args = rnd_loss_args(new_logprob=torch.tensor([0.1, -0.3]), new_ext_value=torch.tensor([1.5, 2.0]), clip_vloss=True)
    args["norm_adv"] = True
    loss, stats = call_ppo_rnd_loss(**args)
    minibatch = {"logprobs": args["old_logprob"], "values": args["old_ext_value"], "advantages": args["advantages"]}
    minibatch |= {"returns": args["ext_returns"], "valid": args["mask"]}
    statistics = ppo_atari_envpool.minibatch_statistics(minibatch)
    coefficients = dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=True)
    outputs = (args["new_logprob"], args["new_ext_value"], args["entropy"])
    ppo, ppo_stats = ppo_atari_envpool.ppo_loss(*outputs, minibatch, statistics, **coefficients)
    assert loss.item() == pytest.approx(ppo.item())
    for name in ppo_stats:
        assert stats[name].item() == pytest.approx(ppo_stats[name].item()), name
    assert stats["rnd_loss"].item() == 0.0


def test_masked_means_divide_by_the_count_they_are_given():
    """masked_mean is ppo_atari_envpool's (the count passed, not the mask's local sum): the loss divides by
    statistics["valid_count"] and the predictor loss by statistics["rnd_count"], whatever the minibatch holds."""
    x, mask = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 1.0, 0.0])
    assert masked_mean(x, mask, torch.tensor(2.0)).item() == 1.5
    assert masked_mean(x, mask, torch.tensor(6.0)).item() == 0.5  # e.g. a count over more entries than these
    args = blank_loss_args(3, entropy=x, prediction_error=x, mask=mask, rnd_mask=torch.tensor([0.0, 1.0, 1.0]))
    minibatch = rnd_minibatch(**{name: args.pop(name) for name in MINIBATCH_ARGS})
    outputs = [args.pop(name) for name in ("new_logprob", "new_ext_value", "new_int_value", "entropy", "prediction_error")]
    outputs[1:3] = [tuple(outputs[1:3])]  # (extrinsic, intrinsic) values
    statistics = rnd_statistics(minibatch)
    assert (statistics["valid_count"].item(), statistics["rnd_count"].item()) == (2.0, 1.0)
    _, stats = ppo_rnd_loss(*outputs, minibatch, statistics, **args)
    assert (stats["entropy"].item(), stats["rnd_loss"].item()) == (1.5, 2.0)
    statistics |= {"valid_count": torch.tensor(6.0), "rnd_count": torch.tensor(4.0)}
    _, stats = ppo_rnd_loss(*outputs, minibatch, statistics, **args)
    assert (stats["entropy"].item(), stats["rnd_loss"].item()) == (0.5, 0.5)


def blank_loss_args(n, **overrides):
    """n states with zero advantages, values, returns and entropy, all real; flags as rnd_loss_args."""
    names = "new_logprob old_logprob advantages new_ext_value old_ext_value ext_returns new_int_value old_int_value "
    names += "int_returns entropy prediction_error"
    zeros = {name: torch.zeros(n) for name in names.split()}
    return rnd_loss_args(**zeros | {"mask": torch.ones(n), "rnd_mask": torch.ones(n)} | overrides)


def test_loss_sums_value_losses_and_adds_the_masked_predictor_loss():
    prediction_error = torch.tensor([1.0, 2.0, 4.5])
    ext_values, int_values = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 2.0, 5.0])
    values = dict(new_ext_value=ext_values, old_ext_value=ext_values, new_int_value=int_values, old_int_value=int_values)
    masks = dict(mask=torch.tensor([1.0, 1.0, 0.0]), rnd_mask=torch.tensor([0.0, 1.0, 1.0]))
    args = blank_loss_args(3, prediction_error=prediction_error, **values, **masks)
    loss, stats = call_ppo_rnd_loss(**args)
    # entry 2 is a reset step (mask 0): it counts nowhere. ext: 0.5 * mean(1, 0) = 0.25; int: 0.5 * mean(0, 4) = 1
    assert stats["ext_value_loss"].item() == pytest.approx(0.25)
    assert stats["int_value_loss"].item() == pytest.approx(1.0)
    assert stats["value_loss"].item() == pytest.approx(1.25)
    # predictor loss over the entries with mask and rnd_mask: entry 1 only -> 2
    assert stats["rnd_loss"].item() == pytest.approx(2.0)
    assert loss.item() == pytest.approx(0.5 * 1.25 + 2.0)


def test_clip_vloss_clips_the_extrinsic_value_loss_only_as_cleanrl():
    # old value 0, new value 1, return 2, clip 0.2: unclipped 0.5 * (1 - 2)^2 = 0.5; clipped 0.5 * (0.2 - 2)^2 = 1.62
    one = dict(new_ext_value=torch.ones(1), new_int_value=torch.ones(1), ext_returns=torch.full((1,), 2.0))
    args = blank_loss_args(1, **one, int_returns=torch.full((1,), 2.0), clip_vloss=True)
    _, stats = call_ppo_rnd_loss(**args)
    assert stats["ext_value_loss"].item() == pytest.approx(1.62)
    assert stats["int_value_loss"].item() == pytest.approx(0.5)


def test_agent_is_cleanrl_ppo_rnd_network():
    agent = ppo_rnd_atari.Agent(18, separate_networks=False)
    # CleanRL's ppo_rnd_envpool.py Agent for 18 actions, layer by layer (weights + biases): the Nature-CNN convolutions,
    # dense 3136 -> 256 -> 448, the extra layer 448 -> 448, the actor 448 -> 448 -> 18 and two value heads 448 -> 1
    convolutions = (4 * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64)
    dense = (3136 * 256 + 256) + (256 * 448 + 448) + (448 * 448 + 448) + (448 * 448 + 448) + (448 * 18 + 18) + 2 * 449
    assert sum(parameter.numel() for parameter in agent.parameters()) == convolutions + dense == 1_407_476
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    hidden = agent.actor_encoder(obs.float() / 255.0)
    _, _, _, ext_value, int_value, logits = agent.get_action_and_value(obs.clone())
    features = hidden + agent.critic_extra_layer(hidden)  # the value heads read the features plus the extra layer's
    torch.testing.assert_close(ext_value, agent.critic_ext(features).squeeze(-1))
    torch.testing.assert_close(int_value, agent.critic_int(features).squeeze(-1))
    torch.testing.assert_close(logits, agent.actor(agent.actor_hidden(hidden)))
    # the dormant neurons count every hidden ReLU: the encoder's 5, the actor's hidden layer and the extra value layer
    with metrics.hidden_activations(agent) as activations:
        agent.features(obs.clone())
    assert [a.shape[1:].numel() for a in activations] == [32 * 20 * 20, 64 * 9 * 9, 64 * 7 * 7, 256, 448, 448, 448]


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


def test_compute_gradients_fills_the_policy_value_and_predictor_gradients_only():
    torch.manual_seed(0)
    agent, rnd, obs_rms = ppo_rnd_atari.Agent(4, False), RNDModel(), RunningMeanStd(ppo_rnd_atari.FRAME_SHAPE)
    minibatch = {"obs": torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8), "actions": torch.tensor([0, 1, 2, 3])}
    minibatch["next_frames"] = torch.randint(0, 256, (4, *ppo_rnd_atari.FRAME_SHAPE), dtype=torch.uint8)
    minibatch |= rnd_minibatch(*(torch.zeros(4) for _ in range(6)), torch.ones(4), torch.ones(4))
    stats = compute_gradients(agent, rnd, obs_rms, minibatch, rnd_statistics(minibatch), ppo_rnd_atari.Args())
    assert stats["rnd_loss"].item() > 0 and stats["int_value_loss"].item() > 0
    assert all(p.grad is not None for p in [*agent.parameters(), *rnd.predictor.parameters()])
    assert all(p.grad is None for p in rnd.target.parameters())


# --------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded_runs(tmp_path_factory):
    """Two tiny runs with --separate-networks --seed 3, the first also with every artifact flag (which add files, not
    randomness): the tiny-run test reads the first, the reproducibility test compares both."""
    artifacts = [
        "--checkpoint-interval",
        "3",
        "--save-model",
        "--save-embeddings",
        "--embeddings-per-iteration",
        "10",
        "--capture-video",
    ]
    runs_dir = tmp_path_factory.mktemp("seeded")
    track, env = fake_wandb(runs_dir / "first")
    flags = [*TINY_FLAGS, "--separate-networks", "--seed", "3"]
    return run_twice(SCRIPT, runs_dir, flags, [*artifacts, *track], first_env=env)


def test_the_policy_trains_on_ext_coef_times_the_extrinsic_plus_int_coef_times_the_intrinsic_advantage(monkeypatch, tmp_path):
    """ext_coef * A_ext + int_coef * A_int (defaults 2 and 1): with A_ext = 1 and A_int = 10 everywhere, every
    minibatch's advantage is 12 (the coefficients swapped: 21)."""

    def constant(value, gae):
        return lambda *args: (torch.full_like(args[0], value), gae(*args)[1])

    monkeypatch.setattr(ppo_rnd_atari, "compute_gae", constant(1.0, ppo_rnd_atari.compute_gae))
    monkeypatch.setattr(ppo_rnd_atari, "compute_intrinsic_gae", constant(10.0, ppo_rnd_atari.compute_intrinsic_gae))
    seen, statistics = [], ppo_rnd_atari.minibatch_statistics
    monkeypatch.setattr(
        ppo_rnd_atari, "minibatch_statistics", lambda batch: seen.append(batch["advantages"]) or statistics(batch)
    )
    run_main(monkeypatch, ppo_rnd_atari, [*TINY_FLAGS, "--total-timesteps", "64", "--runs-dir", str(tmp_path)])
    assert len(seen) == 4 and all(torch.equal(advantages, torch.full_like(advantages, 12.0)) for advantages in seen)


def test_the_intrinsic_return_filter_carries_over_from_one_rollout_to_the_next(monkeypatch, tmp_path):
    """Non-episodic: each rollout's filter starts from the last one's final state, not from 0."""
    calls, forward_filter = [], ppo_rnd_atari.reward_forward_filter

    def recorded(rewards, valid, running, gamma):
        filtered, final = forward_filter(rewards, valid, running, gamma)
        calls.append((running.clone(), final.clone()))
        return filtered, final

    monkeypatch.setattr(ppo_rnd_atari, "reward_forward_filter", recorded)
    run_main(monkeypatch, ppo_rnd_atari, [*TINY_FLAGS, "--total-timesteps", "96", "--runs-dir", str(tmp_path)])
    assert len(calls) == 3 and not calls[0][0].any() and calls[0][1].all()
    assert all(torch.equal(start, final) for (start, _), (_, final) in zip(calls[1:], calls[:-1], strict=True))


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

    rows = dict(embedding_rows=40, feature_dim=448)  # CleanRL's RND encoder has 448 features
    checkpoint = check_run_artifacts(
        run_dir, "ppo_rnd_atari", iterations=8, global_step=256, metric_iterations=[2, 4, 6, 8], **rows, tracked="fake"
    )
    assert checkpoint["warmup_steps"] == 16
    obs_stats = checkpoint["obs_rms"]
    assert obs_stats["mean"].shape == obs_stats["var"].shape == (1, 84, 84)
    # last frames of the next observations of real transitions: warm-up 32 + training 256, minus reset steps
    assert 200 < obs_stats["count"].item() <= 32 + 256 + 1e-4  # + the prior's 1e-4
    assert 0 < obs_stats["mean"].mean().item() < 255 and obs_stats["var"].max().item() > 0
    int_stats = checkpoint["int_return_rms"]
    assert 200 < int_stats["count"].item() <= 256 + 1e-4 and int_stats["var"].item() > 0
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
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/rnd_loss")
    variants = {"compiled": ["--compile"]}
    check_same_losses(monkeypatch, tmp_path, ppo_rnd_atari, flags, variants, tags, compile_backend="aot_eager")


def test_bf16_logs_the_losses_of_fp32_within_measured_tolerances_and_resumes_either_way(monkeypatch, tmp_path):
    """The policy's encoders in bfloat16; the RND networks, whose difference is the intrinsic reward, in float32."""
    flags = [*TINY_FLAGS, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/rnd_loss")
    check_bf16(monkeypatch, tmp_path, ppo_rnd_atari, flags, tags)


def test_sigterm_checkpoints_and_resume_keeps_the_normalisers(tmp_path):
    flags = [*TINY_FLAGS, "--runs-dir", str(tmp_path)]
    flags[flags.index("--total-timesteps") + 1] = "320"  # 10 iterations: long enough to interrupt
    interrupt_with_sigterm(SCRIPT, flags)  # once the first checkpoint.pt (after iteration 1) exists
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    interrupted_at = checkpoint["iteration"]
    assert 1 <= interrupted_at < 10 and checkpoint["global_step"] == 32 * interrupted_at
    assert checkpoint["warmup_steps"] == 16 and checkpoint["obs_rms"]["count"].item() > 0

    # Plant recognisable statistics: after the resume they must still be there, grown only by
    # the resumed iterations' frames (no new warm-up, no fresh normaliser).
    planted = 1e6
    planted_statistics = {"mean": 100.0, "var": 400.0}
    checkpoint["obs_rms"] = {
        name: torch.full((1, 84, 84), value, dtype=torch.float64) for name, value in planted_statistics.items()
    }
    checkpoint["obs_rms"]["count"] = torch.tensor(planted, dtype=torch.float64)
    checkpoint["int_return_rms"]["count"] = torch.tensor(planted, dtype=torch.float64)
    torch.save(checkpoint, checkpoint_path)

    result = run_script(SCRIPT, "--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda")
    assert result.returncode == 0, result.stderr
    assert "warm-up" not in result.stdout
    assert only_run_dir(tmp_path) == run_dir  # same run directory
    final = torch.load(checkpoint_path, weights_only=True)
    assert_optimizer_went_on(final)
    assert final["iteration"] == 10 and final["global_step"] == 320
    resumed_frames = 32 * (10 - interrupted_at)
    obs_stats = final["obs_rms"]
    assert planted < obs_stats["count"].item() <= planted + resumed_frames
    assert abs(obs_stats["mean"].mean().item() - 100.0) < 1.0  # new frames weigh < 0.13 %
    assert planted < final["int_return_rms"]["count"].item() <= planted + resumed_frames
    steps = [step for step, _ in read_scalars(run_dir)["charts/SPS"]]
    assert steps == [32 * i for i in range(1, 11)]  # every iteration logged exactly once, up to the total


def test_sigterm_during_the_warm_up_saves_without_collecting_a_rollout(tmp_path, monkeypatch):
    """The warm-up stops at the signal, and the run saves at once: it collected a whole training rollout first, to throw
    it away (at 128 envs x 256 steps, time out of Slurm's grace period)."""
    statistics, calls, acted = ppo_rnd_atari.update_frame_statistics, [], []

    def signal_on_the_third_step(*args, **kwargs):
        statistics(*args, **kwargs)
        calls.append(None)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ppo_rnd_atari, "update_frame_statistics", signal_on_the_third_step)
    monkeypatch.setattr(ppo_rnd_atari.Agent, "get_action_and_value", lambda *a, **k: acted.append(1))
    flags = [*TINY_FLAGS, "--runs-dir", str(tmp_path), "--num-iterations-obs-norm-init", "100"]
    with pytest.raises(SystemExit) as exited:
        run_main(monkeypatch, ppo_rnd_atari, flags)
    assert exited.value.code == 128 + signal.SIGTERM and not acted
    checkpoint = torch.load(os.path.join(only_run_dir(tmp_path), "checkpoint.pt"), weights_only=True)
    assert (checkpoint["iteration"], checkpoint["global_step"], checkpoint["warmup_steps"]) == (0, 0, 3)


def test_sigterm_during_the_warm_up_resumes_the_warm_up(tmp_path):
    flags = [*TINY_FLAGS, "--runs-dir", str(tmp_path), "--num-iterations-obs-norm-init", "100000"]
    interrupt_with_sigterm(SCRIPT, flags, "observation-normalisation warm-up")
    checkpoint_path = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["iteration"] == 0 and checkpoint["global_step"] == 0
    assert 0 <= checkpoint["warmup_steps"] < 1_600_000
    assert checkpoint["obs_rms"]["count"].item() <= 2 * checkpoint["warmup_steps"] + 1e-4

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
    (["--num-envs", "0"], "--num-envs must be finite and > 0, got 0"),
    (["--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch (num_envs * num_steps = 16384)"),
    (["--minibatch-size", "20000"], "--minibatch-size 20000 does not divide the batch"),
    (["--minibatch-size", "0"], "--minibatch-size must be finite and > 0"),
    (["--total-timesteps", "100"], "smaller than one batch"),
    (["--env-id", "NoSuchGame-v5"], "not an EnvPool Atari task"),
    (["--env-id", "BigfishEasy-v0"], "not an EnvPool Atari task"),
    (["--learning-rate", "0"], "--learning-rate must be finite and > 0"),
    (["--int-coef", "-1"], "--int-coef must be finite and >= 0"),
    (["--ext-coef", "-0.5"], "--ext-coef must be finite and >= 0"),
    (["--int-gamma", "1.5"], "--int-gamma must be in [0, 1]"),
    (["--repeat-action-probability", "2"], "--repeat-action-probability must be in [0, 1]"),
    (["--update-proportion", "0"], "--update-proportion must be in (0, 1]"),
    (["--num-iterations-obs-norm-init", "-1"], "--num-iterations-obs-norm-init must be finite and >= 0"),
    (["--resume", "/no/such/checkpoint.pt"], "no such checkpoint file"),
    (["--runs-dir", "/proc/forbidden"], "--runs-dir"),
    (["--torch-threads", "0"], "--torch-threads must be finite and > 0, got 0"),
    (["--seed", "-1"], "--seed -1, "),  # the env seeds are C ints: EnvPool's traceback once the run was made
    (["--seed", "2147483647"], "iterations: env seeds ("),
    (
        ["--seed", "2147482912", "--runs-dir", "/proc/forbidden"],
        "--seed 2147482912, 610 iterations: env seeds",
    ),  # 610 iterations, 128 envs: 2**31 the last env seed
    (["--torch-threads", "2147483648"], "--torch-threads must be below 2**31"),
    (["--torch-threads", str((os.cpu_count() or 1) + 1)], "CPUs here"),  # 100,000 threads: a segfault
    (["--cudagraphs"], "--cudagraphs needs --compile and CUDA"),
    (["--save-embeddings", "--metrics-interval", "0"], "--save-embeddings needs --metrics-interval > 0"),
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


def test_a_bad_flag_from_the_shell(tmp_path):
    """The real command line: one line, exit 2 (tyro's refusals and the other checks: in-process, above)."""
    flags = ["--update-proportion", "1.5"]
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and flags[0] in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


def test_defaults_and_derived_values():
    args = ppo_rnd_atari.validate_and_derive(ppo_rnd_atari.Args(runs_dir="/tmp"))
    assert args.env_id == "MontezumaRevenge-v5" and args.repeat_action_probability == 0.25
    assert (args.num_envs, args.num_steps, args.batch_size, args.minibatch_size) == (128, 128, 16384, 4096)
    assert (args.gamma, args.int_gamma, args.ext_coef, args.int_coef) == (0.999, 0.99, 2.0, 1.0)
    assert ppo_rnd_atari.learning_rate(args, args.num_envs, 0) == pytest.approx(1e-4)
    assert args.num_iterations == 10_000_000 // 16384 and args.planned_steps == args.num_iterations * 16384
    args = ppo_rnd_atari.validate_and_derive(
        ppo_rnd_atari.Args(num_envs=512, num_steps=32, minibatch_size=2048, lr_scaling="sqrt", runs_dir="/tmp")
    )
    assert args.num_minibatches == 8 and ppo_rnd_atari.learning_rate(args, 512, 0) == pytest.approx(2e-4)  # k = 512 / 128 = 4
    # annealed linearly over the planned steps, as in ppo_atari_envpool.py
    assert ppo_rnd_atari.learning_rate(args, 512, args.planned_steps // 2) == pytest.approx(1e-4)


RND_FLAGS = (
    "--no-cuda --num-envs 2 --num-steps 16 --num-minibatches 2 --update-epochs 1 --total-timesteps 64 "
    "--num-iterations-obs-norm-init 1 --max-episode-steps 40 --metrics-interval 0 --torch-threads 1"
).split()


def test_intrinsic_reward_is_the_error_over_the_std_of_the_filtered_return_and_a_quarter_trains_the_predictor(
    monkeypatch, tmp_path
):
    filtered_calls, gae_calls, masks = [], [], []
    forward_filter, intrinsic_gae = ppo_rnd_atari.reward_forward_filter, ppo_rnd_atari.compute_intrinsic_gae
    gradients = ppo_rnd_atari.compute_gradients

    def record_filter(rewards, valid, running, gamma):
        result = forward_filter(rewards, valid, running, gamma)
        filtered_calls.append((rewards.clone(), valid.clone(), result[0].clone()))
        return result

    monkeypatch.setattr(ppo_rnd_atari, "reward_forward_filter", record_filter)
    monkeypatch.setattr(
        ppo_rnd_atari, "compute_intrinsic_gae", lambda r, *a: gae_calls.append(r.clone()) or intrinsic_gae(r, *a)
    )
    monkeypatch.setattr(ppo_rnd_atari, "compute_gradients", lambda *a: masks.append(a[3]["rnd_mask"]) or gradients(*a))
    run_main(monkeypatch, ppo_rnd_atari, [*RND_FLAGS, "--runs-dir", str(tmp_path)])
    raw, valid, filtered = filtered_calls[0]  # the first rollout: the return normaliser starts fresh
    fresh = ppo_rnd_atari.RunningMeanStd()
    fresh.update(filtered.flatten(), valid.flatten())
    torch.testing.assert_close(gae_calls[0], raw / fresh.std.float())
    # --update-proportion 0.25: about a quarter of each minibatch trains the predictor (64 draws in all here)
    assert 0.1 < torch.cat(masks).mean().item() < 0.4


def test_the_predictor_loss_counts_the_masked_real_transitions(monkeypatch, tmp_path):
    calls = []
    gradients = ppo_rnd_atari.compute_gradients
    monkeypatch.setattr(
        ppo_rnd_atari, "compute_gradients", lambda *a: calls.append((a[3], a[4]["rnd_count"])) or gradients(*a)
    )
    flags = [*RND_FLAGS, "--max-episode-steps", "5", "--update-proportion", "1", "--runs-dir", str(tmp_path)]
    run_main(monkeypatch, ppo_rnd_atari, flags)
    # every state trains the predictor: the count is the minibatch's real transitions, its reset steps (1 in 6) left out
    counts = [(count.item(), minibatch["valid"].sum().item()) for minibatch, count in calls]
    assert all(count == real for count, real in counts) and any(real < 16 for _, real in counts), counts


def test_a_game_that_ends_in_the_warm_up_does_not_add_its_return_to_the_next(monkeypatch, tmp_path):
    """A reward of 1 on every real step of 5-step games, 16 warm-up steps an env: every logged game returns 5."""
    one_reward_per_step(ppo_rnd_atari, monkeypatch)
    run_main(monkeypatch, ppo_rnd_atari, [*RND_FLAGS, "--max-episode-steps", "5", "--runs-dir", str(tmp_path)])
    returns = [value for _, value in read_scalars(only_run_dir(tmp_path))["charts/episodic_return"]]
    assert len(returns) >= 8 and returns == [5.0] * len(returns)


def test_a_life_lost_on_the_time_limit_is_a_termination(monkeypatch, tmp_path):
    check_life_lost_on_the_time_limit(monkeypatch, tmp_path, ppo_rnd_atari, list(RND_FLAGS))
