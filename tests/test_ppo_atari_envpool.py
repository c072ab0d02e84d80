"""ppo_atari_envpool.py: the loop's maths on hand-made tensors, EnvPool's reset step on a real tiny
episode, and the script end to end on a tiny CPU budget."""

import dataclasses
import glob
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import envpool
import numpy as np
import pytest
import torch
from conftest import (
    PPO_TAGS,
    ROOT,
    TINY_PPO_FLAGS,
    check_bf16,
    check_life_lost_on_the_time_limit,
    check_run_artifacts,
    check_same_losses,
    one_reward_per_step,
    only_run_dir,
    read_scalars,
    run_main,
    run_script,
    run_torchrun,
    run_twice,
    stop_after_first_checkpoint,
    torchrun,
    tyro_error,
    usage_error,
    with_schedule,
)

import metrics
import ppo_atari_envpool
from ppo_atari_envpool import compute_gae, minibatch_statistics, ppo_loss, reset_step_mask


def gae(rewards, values, terminations, truncations, valid, next_value, gamma=0.5, lam=0.5):
    column = lambda xs: torch.tensor(xs, dtype=torch.float32)[:, None]  # noqa: E731 - (T, N=1)
    return compute_gae(
        column(rewards),
        column(values),
        column(terminations),
        column(truncations),
        column(valid),
        torch.tensor([next_value]),
        gamma,
        lam,
    )


def test_gae_termination_and_reset_step():
    # t=1 ends the episode (terminal), t=2 is EnvPool's reset step, t=3 a new episode.
    advantages, returns = gae(
        rewards=[1, 2, 0, 3],
        values=[0.5, 1.0, 4.0, 2.0],
        terminations=[0, 1, 0, 0],
        truncations=[0, 0, 0, 0],
        valid=[1, 1, 0, 1],
        next_value=1.0,
    )
    # t=3: 3 + 0.5*1 - 2 = 1.5; t=2: masked; t=1: 2 + 0 - 1 = 1 (no bootstrap, chain cut);
    # t=0: (1 + 0.5*1 - 0.5) + 0.5*0.5*1 = 1.25
    assert advantages[:, 0].tolist() == pytest.approx([1.25, 1.0, 0.0, 1.5])
    assert returns[:, 0].tolist() == pytest.approx([1.75, 2.0, 4.0, 3.5])


def test_gae_lambda_return_stops_at_an_episode_end_even_without_a_reset_step():
    # t=0 terminates and t=1 is a valid step (a contract the reset step usually hides): t=0 takes nothing from t=1
    advantages, _ = gae(rewards=[1, 1], values=[0, 0], terminations=[1, 0], truncations=[0, 0], valid=[1, 1], next_value=0.0)
    assert advantages[:, 0].tolist() == pytest.approx([1.0, 1.0])  # chained on: 1 + 0.25 * 1 = 1.25 at t=0


def test_gae_truncation_bootstraps_from_last_observation():
    # Same rollout but t=1 is a time-limit truncation: values[2] = V(last observation) = 4
    advantages, _ = gae(
        rewards=[1, 2, 0, 3],
        values=[0.5, 1.0, 4.0, 2.0],
        terminations=[0, 0, 0, 0],
        truncations=[0, 1, 0, 0],
        valid=[1, 1, 0, 1],
        next_value=1.0,
    )
    # t=1: 2 + 0.5*4 - 1 = 3 (chain still cut); t=0: 1 + 0.25*3 = 1.75
    assert advantages[:, 0].tolist() == pytest.approx([1.75, 3.0, 0.0, 1.5])


def test_gae_without_episode_end_is_plain_gae():
    advantages, _ = gae(rewards=[1, 1], values=[0, 0], terminations=[0, 0], truncations=[0, 0], valid=[1, 1], next_value=2.0)
    # t=1: 1 + 0.5*2 = 2; t=0: 1 + 0.25*2 = 1.5
    assert advantages[:, 0].tolist() == pytest.approx([1.5, 2.0])


def test_reset_step_mask_on_a_scripted_envpool_episode():
    """Drive a 5-step time limit through EnvPool: the step after the truncation is the reset step."""
    env = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, seed=0, max_episode_steps=5)
    env.reset()
    previous_done = torch.zeros(1)
    masks, rewards, elapsed, truncated = [], [], [], []
    for _ in range(12):
        masks.append(reset_step_mask(previous_done).item())
        _, reward, terminated, truncation, info = env.step(np.zeros(1, dtype=np.int64))
        rewards.append(float(reward[0]))
        elapsed.append(int(info["elapsed_step"][0]))
        truncated.append(bool(truncation[0]))
        previous_done = torch.as_tensor(terminated | truncation, dtype=torch.float32)
    env.close()
    # steps 0-4 are the episode (truncated at step 4), step 5 resets, 6-10 next episode, 11 resets
    assert truncated == [False] * 4 + [True] + [False] * 5 + [True] + [False]
    assert masks == [1.0] * 5 + [0.0] + [1.0] * 5 + [0.0]
    assert elapsed[5] == 0 and elapsed[11] == 0  # the reset step starts a new episode
    assert rewards[5] == 0.0 and rewards[11] == 0.0


def test_reset_step_mask_after_a_lost_life():
    """With episodic_life (the training setting) a lost life ends an EnvPool episode: the next step is a reset step too
    (masked, reward 0, not counted in elapsed_step), while the game and its return go on until the last life."""
    env = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, seed=0, episodic_life=True, reward_clip=True)
    env.reset()
    actions = np.random.default_rng(0).integers(0, 4, size=(400, 1))
    previous_done, steps = torch.zeros(1), []
    for action in actions:
        mask = reset_step_mask(previous_done).item()
        _, reward, terminated, truncated, info = env.step(action)
        steps.append((mask, float(reward[0]), bool(terminated[0]), int(info["elapsed_step"][0]), bool(info["terminated"][0])))
        previous_done = torch.as_tensor(terminated | truncated, dtype=torch.float32)
    env.close()
    lives_lost = [t for t, (_, _, terminated, _, _) in enumerate(steps) if terminated]
    assert len(lives_lost) >= 5  # a random policy loses Breakout's 5 lives within 400 steps
    for t in lives_lost[:5]:
        mask, reward, _, elapsed, _ = steps[t + 1]
        assert (mask, reward, elapsed) == (0.0, 0.0, steps[t][3] if t < lives_lost[4] else 0), t
        assert steps[t][4] == (t == lives_lost[4])  # the game is over at the fifth lost life only
    assert sum(mask == 0.0 for mask, *_ in steps) == len([t for t in lives_lost if t + 1 < len(steps)])


def loss_args(**overrides):
    base = dict(
        new_logprob=torch.zeros(2),
        old_logprob=torch.zeros(2),
        advantages=torch.tensor([1.0, -2.0]),
        new_value=torch.tensor([1.0, 2.0]),
        old_value=torch.tensor([1.0, 2.0]),
        returns=torch.zeros(2),
        entropy=torch.tensor([0.5, 1.5]),
        mask=torch.ones(2),
        clip_coef=0.2,
        clip_vloss=False,
        ent_coef=0.01,
        vf_coef=0.5,
        norm_adv=False,
    )
    return {**base, **overrides}


def call_ppo_loss(new_logprob, old_logprob, advantages, new_value, old_value, returns, entropy, mask, **coefficients):
    minibatch = {"logprobs": old_logprob, "values": old_value, "advantages": advantages, "returns": returns, "valid": mask}
    return ppo_loss(new_logprob, new_value, entropy, minibatch, minibatch_statistics(minibatch), **coefficients)


def test_ppo_loss_hand_computed():
    loss, stats = call_ppo_loss(**loss_args())
    # ratio 1: policy loss -mean(A) = 0.5; value 0.5 * mean(1, 4) = 1.25; entropy mean 1
    assert stats["policy_loss"].item() == pytest.approx(0.5)
    assert stats["value_loss"].item() == pytest.approx(1.25)
    assert stats["entropy"].item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(0.5 - 0.01 * 1.0 + 0.5 * 1.25)


def test_ppo_loss_clips_the_ratio():
    up = torch.full((1,), math.log(1.5))
    _, positive = call_ppo_loss(
        **loss_args(
            new_logprob=up,
            old_logprob=torch.zeros(1),
            advantages=torch.ones(1),
            new_value=torch.zeros(1),
            old_value=torch.zeros(1),
            returns=torch.zeros(1),
            entropy=torch.zeros(1),
            mask=torch.ones(1),
        )
    )
    assert positive["policy_loss"].item() == pytest.approx(-1.2)  # gain capped at 1 + eps
    assert positive["clipfrac"].item() == 1.0
    _, negative = call_ppo_loss(
        **loss_args(
            new_logprob=up,
            old_logprob=torch.zeros(1),
            advantages=-torch.ones(1),
            new_value=torch.zeros(1),
            old_value=torch.zeros(1),
            returns=torch.zeros(1),
            entropy=torch.zeros(1),
            mask=torch.ones(1),
        )
    )
    assert negative["policy_loss"].item() == pytest.approx(1.5)  # pessimistic: unclipped loss kept


def test_measure_agent_compares_the_updated_policy_with_the_behaviour_policy_in_that_direction():
    """A state-independent update by hand (the actor head's weights 0, its bias (log 3, 0, 0, 0): pi_new = (1/2, 1/6,
    1/6, 1/6)) from a uniform behaviour policy, actions 0-3 once each: KL(behaviour || new) = (log(1/2) + 3 log(3/2)) / 4
    = 0.1308 (the other direction: 0.1438); ratios new / behaviour (2, 2/3, 2/3, 2/3), ESS 16 / (4 x 16/3) = 75 %
    (behaviour / new: 89 %); the same policy in every state: no variance; DDR = batch / KL."""
    agent = ppo_atari_envpool.Agent(4, separate_networks=False)
    with torch.no_grad():
        agent.actor.weight.zero_()
        agent.actor.bias.copy_(torch.tensor([math.log(3.0), 0.0, 0.0, 0.0]))
    obs = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    measured = ppo_atari_envpool.measure_agent(agent, obs, torch.arange(4), torch.zeros(4, 4), 1024, 0.025)
    kl = (math.log(0.5) + 3 * math.log(1.5)) / 4
    assert measured["kl_behavior"] == pytest.approx(kl, rel=1e-5) and measured["ddr"] == pytest.approx(1024 / kl, rel=1e-5)
    assert measured["ess_pct"] == pytest.approx(75.0, rel=1e-5) and measured["policy_variance"] == pytest.approx(0.0, abs=1e-9)


def test_ppo_loss_clips_a_falling_ratio_and_measures_k3_kl():
    # ratio 0.5 < 1 - eps with A = -1: the loss keeps the clipped 0.8 (pessimistic), not 0.5; k3 KL = (r - 1) - log r
    down = torch.full((1,), math.log(0.5))
    single = dict(old_logprob=torch.zeros(1), new_value=torch.zeros(1), old_value=torch.zeros(1), returns=torch.zeros(1))
    single |= dict(entropy=torch.zeros(1), mask=torch.ones(1))
    _, stats = call_ppo_loss(**loss_args(new_logprob=down, advantages=-torch.ones(1), **single))
    assert stats["policy_loss"].item() == pytest.approx(0.8)
    assert stats["clipfrac"].item() == 1.0
    assert stats["approx_kl"].item() == pytest.approx(-0.5 + math.log(2))


def test_minibatch_statistics_count_and_normalise_real_transitions_only():
    minibatch = {"valid": torch.tensor([1.0, 1.0, 1.0, 0.0]), "advantages": torch.tensor([1.0, 2.0, 3.0, 100.0])}
    statistics = minibatch_statistics(minibatch)
    assert statistics["valid_count"].item() == 3.0 and statistics["advantage_mean"].item() == pytest.approx(2.0)
    assert statistics["advantage_std"].item() == pytest.approx(math.sqrt(2 / 3))  # population std of (1, 2, 3)


def test_ppo_loss_ignores_masked_entries():
    valid = call_ppo_loss(
        **loss_args(
            new_logprob=torch.zeros(1),
            old_logprob=torch.zeros(1),
            advantages=torch.tensor([1.0]),
            new_value=torch.tensor([1.0]),
            old_value=torch.tensor([0.5]),
            returns=torch.zeros(1),
            entropy=torch.tensor([0.5]),
            mask=torch.ones(1),
            clip_vloss=True,
            norm_adv=True,
        )
    )[0]
    garbage = call_ppo_loss(
        **loss_args(
            new_logprob=torch.tensor([0.0, 3.0]),
            old_logprob=torch.tensor([0.0, -3.0]),
            advantages=torch.tensor([1.0, 100.0]),
            new_value=torch.tensor([1.0, 50.0]),
            old_value=torch.tensor([0.5, -50.0]),
            returns=torch.tensor([0.0, 9.0]),
            entropy=torch.tensor([0.5, 7.0]),
            mask=torch.tensor([1.0, 0.0]),
            clip_vloss=True,
            norm_adv=True,
        )
    )[0]
    assert garbage.item() == pytest.approx(valid.item())


def test_clipped_value_loss_is_pessimistic():
    _, stats = call_ppo_loss(
        **loss_args(new_value=torch.tensor([1.0, 2.0]), old_value=torch.tensor([0.0, 2.0]), clip_vloss=True)
    )
    # entry 1: unclipped (1-0)^2 = 1, clipped (0.2-0)^2 = 0.04 -> max 1; entry 2: 4 -> 0.5 * mean(1, 4)
    assert stats["value_loss"].item() == pytest.approx(1.25)
    _, stats = call_ppo_loss(
        **loss_args(
            new_value=torch.tensor([1.0, 2.0]),
            old_value=torch.tensor([3.0, 2.0]),
            returns=torch.tensor([3.0, 2.0]),
            clip_vloss=True,
        )
    )
    # entry 1: unclipped (1-3)^2 = 4, clipped (2.8-3)^2 = 0.04 -> 4; entry 2: 0 -> 0.5 * mean(4, 0) = 1
    assert stats["value_loss"].item() == pytest.approx(1.0)


SCRIPT = "ppo_atari_envpool.py"


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
        "--track",
    ]
    flags = [*TINY_PPO_FLAGS, "--separate-networks", "--seed", "3"]
    return run_twice(SCRIPT, tmp_path_factory.mktemp("seeded"), flags, artifacts)


def test_tiny_run_writes_every_tag_and_artifact(seeded_runs):
    _, run_dir = seeded_runs[0]
    assert os.path.basename(run_dir).startswith("Breakout-v5__ppo_atari_envpool__3__")

    scalars = read_scalars(run_dir)
    assert PPO_TAGS <= set(scalars), PPO_TAGS - set(scalars)
    # 256 steps / 32 per iteration = 8 iterations, metrics on 2, 4, 6, 8
    assert [step for step, _ in scalars["charts/SPS"]] == [32 * i for i in range(1, 9)]
    assert [step for step, _ in scalars["metrics/feature_rank"]] == [64, 128, 192, 256]
    for tag in PPO_TAGS - {"losses/explained_variance"}:
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag
    assert all(0 < value <= 100 for _, value in scalars["metrics/ess_pct"])
    assert all(1 <= value <= 24 for _, value in scalars["metrics/feature_rank"])  # at most the metrics batch
    # The first minibatch meets the weights that acted: in float32 its ratios are 1 up to rounding
    assert all(0 <= value < 1e-9 for _, value in scalars["losses/first_minibatch_approx_kl"])
    assert all(value == 0 for _, value in scalars["losses/first_minibatch_clipfrac"])
    returns = [value for _, value in scalars["charts/episodic_return"]]
    assert all(value >= 0 for value in returns) and len(returns) >= 2  # Breakout scores are never negative
    # A game spans its lives (episodic_life ends an EnvPool episode per life, ~24 steps apart for this policy): every game
    # here runs to the 40-step time limit, 3 a process in its 128 steps (each with a reset step after it)
    assert [value for _, value in scalars["charts/episodic_length"]] == [40] * 6

    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["batch_size"] == 32 and args["phases"] == [[0, 2, 16, 16]] and args["num_iterations"] == 8
    assert args["script"] == "ppo_atari_envpool.py"  # sweeps/launch.sh tells a variant's run apart by it
    assert args["device"] == "cpu" and args["processes"] == 1  # --cuda (the default) fell back to the CPU here

    check_run_artifacts(
        run_dir,
        "ppo_atari_envpool",
        iterations=8,
        global_step=256,
        metric_iterations=[2, 4, 6, 8],
        embedding_rows=40,
        tracked=True,
    )


def test_seeded_runs_are_reproducible_and_separate_networks_log_critic_rank(seeded_runs):
    logged = [read_scalars(run_dir) for _, run_dir in seeded_runs]
    for tag in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl", "metrics/grad_kurtosis"):
        assert logged[0][tag] == logged[1][tag], tag
    assert "metrics/feature_rank_critic" in logged[0]


def test_compiled_and_nchw_paths_log_the_losses_of_the_default_path(monkeypatch, tmp_path, tiny_ppo_flags):
    """--compile (torch.compile of acting and of the update) and --no-channels-last (CleanRL's layout) change how
    the same maths runs, not what is learned: on a fixed seed the losses agree up to float rounding. --compile traced
    and differentiated by aot_eager, as in every script's test: inductor's code generation for the CPU cost about 30 s
    of the suite on a cold cache; the CUDA tests (test_cuda_path.py, on a GPU machine) run inductor end to end."""
    flags = [*tiny_ppo_flags, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    check_same_losses(
        monkeypatch,
        tmp_path,
        ppo_atari_envpool,
        flags,
        {"compiled": ["--compile"], "nchw": ["--no-channels-last"]},
        ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"),
        compile_backend="aot_eager",
    )


def test_bf16_runs_the_encoders_in_bfloat16_and_the_heads_in_float32():
    """--bf16 autocasts the encoders only: every hidden activation is bfloat16, the features, logits, log-probabilities
    and values are float32, and the parameters stay float32 (what the optimizer and the checkpoints hold)."""
    agent = ppo_atari_envpool.Agent(4, separate_networks=True, bf16=True)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    with ppo_atari_envpool.metrics.hidden_activations(agent) as activations:
        _, logprob, entropy, value, logits = agent.get_action_and_value(obs)
    assert len(activations) == 8 and {a.dtype for a in activations} == {torch.bfloat16}
    assert {t.dtype for t in (*agent.features(obs), logprob, entropy, value, logits)} == {torch.float32}
    assert {p.dtype for p in agent.parameters()} == {torch.float32}
    fp32 = ppo_atari_envpool.Agent(4, separate_networks=True)
    fp32.load_state_dict(agent.state_dict())
    with ppo_atari_envpool.metrics.hidden_activations(fp32) as activations:
        fp32_logits = fp32.get_action_and_value(obs)[4]
    assert {a.dtype for a in activations} == {torch.float32}
    assert torch.allclose(logits, fp32_logits, atol=1e-3) and not torch.equal(logits, fp32_logits)
    # Pixels straight to bfloat16: every k / 255 rounds to what autocast would make of float32's k / 255
    pixels = torch.arange(256).to(torch.uint8)
    assert torch.equal(pixels.to(torch.bfloat16).div_(255.0), pixels.float().div_(255.0).to(torch.bfloat16))


def test_bf16_logs_the_losses_of_fp32_within_measured_tolerances_and_resumes_either_way(monkeypatch, tmp_path, tiny_ppo_flags):
    flags = [*tiny_ppo_flags, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl")
    check_bf16(monkeypatch, tmp_path, ppo_atari_envpool, flags, tags)


def test_the_checkpoint_of_a_phase_end_resumes_the_next_phase_as_the_run_went_on(monkeypatch, tmp_path, tiny_ppo_flags):
    """A --schedule run saves as each phase ends (a larger phase may not fit in memory). Resumed from that checkpoint,
    the next phase trains exactly as the uninterrupted run did: the same env seed for its new pool, torch's RNG restored.
    4 iterations of 2 x 16, then 2 of 4 x 16; the checkpoint of step 128 is copied as it is written."""
    flags = [*with_schedule(tiny_ppo_flags, "0:2x16,0.5:4x16"), "--seed", "3"]
    resumed, save_checkpoint = tmp_path / "b", ppo_atari_envpool.save_checkpoint
    resumed.mkdir()

    def save_and_copy_the_phase_end(run_dir, args, loop_state, embeddings, **modules):
        save_checkpoint(run_dir, args, loop_state, embeddings, **modules)
        for name in ("checkpoint.pt", "args.json") if loop_state["global_step"] == 128 else ():
            (resumed / name).write_bytes(open(os.path.join(run_dir, name), "rb").read())

    monkeypatch.setattr(ppo_atari_envpool, "save_checkpoint", save_and_copy_the_phase_end)
    run_main(monkeypatch, ppo_atari_envpool, [*flags, "--runs-dir", str(tmp_path / "a")])
    monkeypatch.setattr(ppo_atari_envpool, "save_checkpoint", save_checkpoint)
    run_dir = only_run_dir(tmp_path / "a")
    assert torch.load(resumed / "checkpoint.pt", weights_only=True)["global_step"] == 128
    run_main(monkeypatch, ppo_atari_envpool, ["--resume", str(resumed / "checkpoint.pt")])
    uninterrupted, again = read_scalars(run_dir), read_scalars(str(resumed))
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl", "metrics/grad_kurtosis"):
        assert [point for point in uninterrupted[tag] if point[0] > 128] == again[tag], tag


def test_sigterm_checkpoints_and_resume_reaches_the_same_total_across_phases_with_a_ddr_target(
    monkeypatch, capsys, tmp_path, tiny_ppo_flags
):
    """Two phases with different batches (2 x 16, then 4 x 16 from a quarter of 768 steps) and a DDR target far under
    the tiny run's DDR: stopped by SIGTERM after its first iteration (in-process; a real signal to a real process is the
    torchrun test's) and resumed, every iteration logs its phase's sizes once, the clip epsilon only grows (the
    checkpoint carries the adapted value) and the run ends exactly at the planned 768 steps."""
    flags = [*with_schedule(tiny_ppo_flags, "0:2x16,0.25:4x16"), "--runs-dir", str(tmp_path), "--target-ddr", "1000"]
    flags[flags.index("--total-timesteps") + 1] = "768"  # 6 batches of 32, then 9 of 64
    steps = [32 * i for i in range(1, 7)] + [192 + 64 * i for i in range(1, 10)]
    stop_after_first_checkpoint(monkeypatch, ppo_atari_envpool, flags)
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (1, 32)
    assert not os.path.exists(os.path.join(run_dir, "done.json"))

    # Flags of what to learn come from the checkpoint: one given again unchanged passes quietly, another is named
    again, other = ["--schedule", "0:2x16,0.25:4x16"], ["--total-timesteps", "999"]
    capsys.readouterr()
    run_main(monkeypatch, ppo_atari_envpool, ["--resume", checkpoint_path, "--checkpoint-interval", "1000", *again, *other])
    assert "notice: --resume continues the run with its own flags; not used: --total-timesteps\n" in capsys.readouterr().out
    assert only_run_dir(tmp_path) == run_dir  # same run directory
    final = torch.load(checkpoint_path, weights_only=True)
    assert final["iteration"] == 15 and final["global_step"] == 768
    assert json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 768, "iterations": 15}  # finished now
    scalars = read_scalars(run_dir)
    for tag in ("charts/SPS", "charts/num_envs", "metrics/ddr", "charts/target_ddr"):  # every iteration once, to the total
        assert [step for step, _ in scalars[tag]] == steps, tag
    assert [value for _, value in scalars["charts/target_ddr"]] == [1000] * 15  # no --target-ddr-final: constant
    # the metrics every 2 iterations and on the last, the 15th
    assert [step for step, _ in scalars["metrics/feature_rank"]] == [steps[i - 1] for i in (*range(2, 15, 2), 15)]
    assert [value for _, value in scalars["charts/num_envs"]] == [2] * 6 + [4] * 9
    assert [value for _, value in scalars["charts/batch_size"]] == [32] * 6 + [64] * 9
    clip_coefs = [value for _, value in scalars["charts/clip_coef"]]
    assert clip_coefs[0] == pytest.approx(0.1) and clip_coefs == sorted(clip_coefs) and clip_coefs[-1] > 0.1
    # Each iteration's epsilon is the last one's, adapted to its DDR: a resume that restarted from 0.1 would break this
    ddrs = [value for _, value in scalars["metrics/ddr"]]
    adapt = ppo_atari_envpool.adapted_step_size
    adapted = [adapt(clip_coef, ddr, 1000, 0.1, (0.01, 0.5)) for clip_coef, ddr in zip(clip_coefs, ddrs, strict=True)]
    assert clip_coefs[1:] == pytest.approx(adapted[:-1], rel=1e-5)
    # Adam went on from the saved moments and step count: 15 iterations x 2 epochs x 2 minibatches
    assert {int(state["step"]) for state in final["optimizer"]["state"].values()} == {60}
    # Finished (done.json): refused before the run directory is touched (no new event file). Without done.json, the
    # same resume would complete the run's finishing steps (tests/test_sweeps.py's re-run)
    event_files = os.listdir(run_dir)
    line = usage_error(ppo_atari_envpool.main, monkeypatch, capsys, [SCRIPT, "--resume", checkpoint_path, "--no-cuda"])
    assert line == f"error: --resume {checkpoint_path!r}: that run is finished ({os.path.join(run_dir, 'done.json')})"
    assert os.listdir(run_dir) == event_files


def test_resume_continues_torchs_random_numbers_where_the_checkpoint_left_them(monkeypatch, tmp_path, tiny_ppo_flags):
    """torch draws the actions, minibatches and metric samples: a resumed run starts from the generator state that the
    checkpoint saved (not from the seed), before its first rollout."""
    flags = [*tiny_ppo_flags, "--total-timesteps", "64", "--checkpoint-interval", "1", "--torch-threads", "1"]
    run_main(monkeypatch, ppo_atari_envpool, [*flags, "--runs-dir", str(tmp_path)])  # 2 iterations
    checkpoint_path = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    checkpoint["args"]["total_timesteps"] = 128  # 2 more iterations for the resumed run
    torch.save(checkpoint, checkpoint_path)
    os.remove(os.path.join(only_run_dir(tmp_path), "done.json"))  # not finished any more: --resume takes it
    at_first_rollout = []
    start_phase = ppo_atari_envpool.start_phase
    monkeypatch.setattr(
        ppo_atari_envpool, "start_phase", lambda *a: at_first_rollout.append(torch.get_rng_state()) or start_phase(*a)
    )
    run_main(monkeypatch, ppo_atari_envpool, ["--resume", checkpoint_path, "--no-cuda"])
    assert torch.equal(at_first_rollout[0], checkpoint["rng"]["torch"])
    assert not torch.equal(checkpoint["rng"]["torch"], torch.manual_seed(1).get_state())  # 2 iterations drew from it
    # A flag of how to run that the resume command does not give again is the run's: --checkpoint-interval 1 went on
    assert torch.load(checkpoint_path, weights_only=True)["iteration"] == 4


def test_the_progress_bar_ends_at_the_whole_batches_that_fit_the_budget(tmp_path):
    """--total-timesteps 100 in batches of 2 x 16 steps trains 96: the bar (a plain line when not on a terminal) ends
    at 96 of 96, not at 96 % of 100 as if the run had stopped early."""
    flags = ["--no-cuda", "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "100", "--metrics-interval", "0"]
    result = run_script(SCRIPT, *flags, "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("100%|##########| 96.0/96.0 "), result.stdout
    assert "episodic_return" not in result.stdout  # no game ended in 48 steps: no return to show (it showed nan)


def test_metrics_sample_real_transitions_only(monkeypatch, tmp_path, tiny_ppo_flags):
    """With a 5-step time limit one step in six or more is a reset step: a metrics batch larger than the rollout measures
    exactly its real transitions (the valid ones that compute_gae got), none of the reset steps."""
    flags = [*tiny_ppo_flags, "--total-timesteps", "64", "--max-episode-steps", "5", "--metrics-batch", "64"]
    valid_counts, measured_counts = [], []
    compute_gae, measure_agent = ppo_atari_envpool.compute_gae, ppo_atari_envpool.measure_agent
    monkeypatch.setattr(ppo_atari_envpool, "compute_gae", lambda *a: valid_counts.append(int(a[4].sum())) or compute_gae(*a))
    monkeypatch.setattr(ppo_atari_envpool, "measure_agent", lambda *a: measured_counts.append(len(a[1])) or measure_agent(*a))
    run_main(monkeypatch, ppo_atari_envpool, [*flags, "--torch-threads", "1", "--runs-dir", str(tmp_path)])
    assert len(valid_counts) == 2 and measured_counts == [valid_counts[1]] and valid_counts[1] <= 32 - 4  # 2 resets an env


BAD_FLAGS = [
    (["--num-envs", "0"], "--num-envs must be finite and > 0, got 0"),
    (["--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch (num_envs * num_steps = 1024)"),
    (["--num-minibatches", "2000"], "--num-minibatches 2000 does not divide the batch"),
    (["--minibatch-size", "5000"], "--minibatch-size 5000 does not divide the batch"),
    (["--minibatch-size", "100"], "--minibatch-size 100 does not divide the batch"),
    (["--minibatch-size", "0"], "--minibatch-size must be finite and > 0"),
    (["--total-timesteps", "100"], "smaller than one batch"),
    (["--env-id", "NoSuchGame-v5"], "not an EnvPool Atari task"),
    (["--env-id", "Ant-v5"], "not an EnvPool Atari task"),
    (["--env-id", "BigfishEasy-v0"], "not an EnvPool Atari task"),  # Procgen, with or without Qt
    (["--learning-rate", "-0.1"], "--learning-rate must be finite and > 0"),
    (["--ent-coef", "-1"], "--ent-coef must be finite and >= 0"),
    (["--clip-coef", "-0.1"], "--clip-coef must be finite and >= 0"),  # 0 is allowed (Beukman Fig. 6b), below it not
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--max-episode-steps", "0"], "--max-episode-steps must be finite and > 0"),
    (["--resume", "/no/such/checkpoint.pt"], "no such checkpoint file"),
    (["--runs-dir", "/proc/forbidden"], "--runs-dir"),
    (["--torch-threads", "0"], "--torch-threads must be finite and > 0, got 0"),
    (["--cudagraphs"], "--cudagraphs needs --compile and CUDA"),
    (["--save-embeddings", "--metrics-interval", "0"], "--save-embeddings needs --metrics-interval > 0"),
    (["--target-ddr-final", "100"], "--target-ddr-final needs --target-ddr"),
    (["--schedule", "0:8x128,0.5:32x32,0.3:128x8"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0.5:8x128"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0:8x128,1:32x32"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0:8by128"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0:8x0,0.5:8x128"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0:8x128,0.5:3x3"], "does not divide the batch of --schedule phase 0.5:3x3 (num_envs * num_steps = 9)"),
    # a phase that no iteration reaches: the whole batches of the budget end before it (it trained half, silently)
    (["--schedule", "0:4x32,0.5:32x32", "--total-timesteps", "1024"], "phase 0.5:32x32 would train no iteration"),
    (["--schedule", "0:4x32,0.99:8x16", "--total-timesteps", "1024"], "phase 0.99:8x16 would train no iteration"),
    # iterations start at 0, 128 and 256 (the third phase's start): the second phase is jumped over
    (["--schedule", "0:4x32,0.15:8x16,0.2:4x32", "--total-timesteps", "1280"], "phase 0.15:8x16 would train no iteration"),
    (["--target-ddr", "0"], "--target-ddr must be finite and > 0, got 0"),
    (["--clip-coef-bounds", "0.5", "0.1"], "--clip-coef-bounds (0.5, 0.1) is not 0 < low <= high < inf"),
    (["--clip-coef-bounds", "0.1", "inf"], "--clip-coef-bounds (0.1, inf) is not 0 < low <= high < inf"),
    (["--learning-rate", "inf"], "--learning-rate must be finite and > 0, got inf"),
    (["--learning-rate", "nan"], "--learning-rate must be finite and > 0, got nan"),
    (["--vf-coef", "inf"], "--vf-coef must be finite and >= 0, got inf"),
    (["--schedule", ""], "--schedule '': write the phases as START:NUM_ENVSxNUM_STEPS"),
    (["--schedule", "0:8x128", "--num-envs=16"], "--schedule gives each phase's num_envs x num_steps: leave out --num-envs"),
    (["--num_steps", "8", "--schedule", "0:8x128"], "leave out --num-steps"),
    (["--compile", "--cudagraphs", "--no-cuda"], "--cudagraphs needs --compile and CUDA"),
    # EnvPool's seeds and sizes are C ints: these ended in its traceback once the run directory was made
    (["--seed", "-1"], "--seed -1, 9,765 iterations: env seeds (seed + iteration + env index) are C ints"),
    (["--seed", "2147474000"], "--seed 2147474000, 9,765 iterations: env seeds"),  # its last phase's seeds overflow
    (["--total-timesteps", "10000000000000000000"], "9,765,625,000,000,000 iterations: env seeds"),  # it hung planning
    (["--max-episode-steps", "2147483648"], "--max-episode-steps must be below 2**31 = 2147483648, got 2147483648"),
    (["--torch-threads", "100000000000000000000"], "--torch-threads must be below 2**31"),
    (["--torch-threads", str((os.cpu_count() or 1) + 1)], "CPUs here"),  # 100,000 threads: a segfault
    (["--checkpoint-interval", "2147483648", "--gamma", "2"], "--checkpoint-interval must be below 2**31"),  # non-negative
]


@pytest.mark.parametrize("flags, fragment", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(ppo_atari_envpool.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags])
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")  # nothing was created


def test_a_clip_epsilon_of_0_is_accepted():
    """Beukman et al.'s Fig. 6b trains standard PPO with eps = 0 (Adam's momentum still moves the ratio)."""
    assert ppo_atari_envpool.validate_and_derive(ppo_atari_envpool.Args(clip_coef=0.0)).clip_coef == 0.0


@pytest.mark.parametrize("flags", [["--num-envs", "eight"], ["--lr-scaling", "cubic"], ["--no-such-flag", "1"]])
def test_flags_tyro_rejects_exit_2_naming_the_flag(tmp_path, monkeypatch, capsys, flags):
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags]
    assert flags[0] in tyro_error(ppo_atari_envpool.main, monkeypatch, capsys, argv)
    assert not os.path.exists(tmp_path / "runs")


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


def test_resume_takes_a_checkpoint_written_before_a_runtime_flag_existed(tmp_path, monkeypatch):
    """Runtime flags (how to run, not what to learn) come from the command line on --resume, so a checkpoint whose
    saved flags lack one (written before --reuse-host-memory existed) still resumes, with the command line's value."""
    saved = dataclasses.asdict(ppo_atari_envpool.validate_and_derive(ppo_atari_envpool.Args(num_envs=4, num_steps=16)))
    del saved["reuse_host_memory"]
    torch.save(
        {"args": saved, "model": {}, "optimizer": {}, "iteration": 1, "global_step": 64, "rng": {}}, tmp_path / "old.pt"
    )
    monkeypatch.setattr(sys, "argv", [SCRIPT, "--resume", str(tmp_path / "old.pt"), "--no-reuse-host-memory"])
    args, checkpoint = ppo_atari_envpool.parse_args()
    assert (args.num_envs, args.reuse_host_memory, checkpoint["global_step"]) == (4, False, 64)


def test_a_bad_flag_from_the_shell(tmp_path):
    """The real command line: one line, exit 2 (tyro's refusals and the other checks: in-process, above)."""
    flags = ["--num-minibatches", "3"]
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and flags[0] in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


def test_minibatch_size_and_lr_scaling_derive_the_rest():
    def derive(**flags):
        return ppo_atari_envpool.validate_and_derive(ppo_atari_envpool.Args(runs_dir="/tmp", **flags))

    args = derive(num_envs=32, num_steps=16, minibatch_size=64, lr_scaling="sqrt", anneal_lr=False)
    assert args.batch_size == 512 and ppo_atari_envpool.phase_at(args, 0) == (32, 16, 64)
    assert ppo_atari_envpool.learning_rate(args, 32, 5000) == pytest.approx(2.5e-4 * 2)  # k = 32 / 8 = 4
    args = derive(num_envs=16, lr_scaling="linear")
    assert ppo_atari_envpool.phase_at(args, 0) == (16, 128, 2048 // 4)
    assert args.num_iterations == 10_000_000 // 2048 and args.planned_steps == args.num_iterations * 2048
    assert ppo_atari_envpool.learning_rate(args, 16, 0) == pytest.approx(5e-4)
    assert ppo_atari_envpool.learning_rate(args, 16, args.planned_steps // 2) == pytest.approx(2.5e-4)  # annealed
    assert ppo_atari_envpool.learning_rate(derive(num_envs=16, lr_scaling="inverse"), 16, 0) == pytest.approx(1.25e-4)


def test_schedule_phases_lr_and_ddr_target_by_step():
    args = ppo_atari_envpool.validate_and_derive(
        ppo_atari_envpool.Args(
            schedule="0:8x128,0.5:32x32,0.8:128x16",
            minibatch_size=256,
            total_timesteps=10_240,
            target_ddr=100.0,
            target_ddr_final=10_000.0,
            runs_dir="/tmp",
        )
    )
    assert args.phases == [(0, 8, 128, 256), (5120, 32, 32, 256), (8192, 128, 16, 256)]
    assert ppo_atari_envpool.phase_at(args, 5119) == (8, 128, 256)  # a fixed minibatch size stays ...
    assert ppo_atari_envpool.phase_at(args, 8192) == (128, 16, 256)  # ... and the number of minibatches follows
    # 5 batches of 1024 reach step 5120 (phase 2), 3 more reach 8192 (phase 3), one batch of 2048 reaches the budget
    assert (args.num_iterations, args.planned_steps, args.num_envs, args.num_steps) == (9, 10_240, 8, 128)
    assert ppo_atari_envpool.learning_rate(args, 8, 5120) == pytest.approx(2.5e-4 / 2)  # annealed over the planned steps
    assert ppo_atari_envpool.target_ddr(args, 0) == pytest.approx(100.0)
    assert ppo_atari_envpool.target_ddr(args, 5120) == pytest.approx(1000.0)  # geometric: halfway, a factor of 10
    args = ppo_atari_envpool.validate_and_derive(ppo_atari_envpool.Args(schedule="0:8x128,0.5:32x64", runs_dir="/tmp"))
    assert ppo_atari_envpool.phase_at(args, 5_000_000) == (32, 64, 2048 // 4)  # no --minibatch-size: 4 minibatches stay


@pytest.mark.parametrize("seed", range(40))
def test_iterations_are_counted_as_the_loop_would_take_them(seed):
    """plan_iterations counts each phase's iterations arithmetically (a loop over them hung on a huge budget): the same
    count as stepping through the budget batch by batch, each batch in the phase its first step falls in."""
    rng = np.random.default_rng(seed)
    starts = np.unique(np.round(rng.uniform(0, 1, rng.integers(0, 4)), 2))
    shapes = [(int(rng.choice([2, 4, 8])), int(rng.choice([8, 16, 32]))) for _ in range(len(starts) + 1)]
    schedule = ",".join(f"{start:g}:{n}x{m}" for start, (n, m) in zip([0, *starts[starts > 0]], shapes, strict=False))
    total = int(rng.integers(64, 2000))
    args = ppo_atari_envpool.Args(schedule=schedule, total_timesteps=total, minibatch_size=2, runs_dir="/tmp")
    phases = ppo_atari_envpool.parse_schedule(schedule)
    step, iterations, trained = 0, 0, set()
    while True:  # the reference: batch by batch
        start, num_envs, num_steps = [phase for phase in phases if int(phase[0] * total) <= step][-1]
        if step + num_envs * num_steps > total:
            break
        step, iterations, trained = step + num_envs * num_steps, iterations + 1, trained | {start}
    if len(trained) < len(phases):  # a phase no batch starts in is refused
        with pytest.raises(SystemExit):
            ppo_atari_envpool.plan_iterations(args)
    else:
        args = ppo_atari_envpool.plan_iterations(args)
        assert (args.num_iterations, args.planned_steps) == (iterations, step), schedule


def test_a_huge_budget_is_planned_at_once():
    args = ppo_atari_envpool.Args(schedule="0:8x128,0.5:32x32", total_timesteps=10**12, seed=0, runs_dir="/tmp")
    args = ppo_atari_envpool.plan_iterations(args)
    assert args.num_iterations == 10**12 // 1024 and args.planned_steps == 10**12 // 1024 * 1024  # both 1024 a batch


@pytest.mark.parametrize("seed, refused", [(2**31 - 82, True), (2**31 - 100, False)])
def test_the_seed_check_counts_the_widest_phase_envs(seed, refused):
    """Phases 8x16 then 64x2 (128 a batch), 2560 steps: 10 iterations each, 20 in all. The last env seed is
    seed + (20 - 1) + (64 - 1) = seed + 82: 2**31 - 82 leaves C ints (the later, wider phase's envs count, not the
    first phase's 8), 2**31 - 100 ends at 2**31 - 18."""
    args = ppo_atari_envpool.Args(schedule="0:8x16,0.5:64x2", total_timesteps=2560, seed=seed, runs_dir="/tmp")
    if refused:
        with pytest.raises(SystemExit):
            ppo_atari_envpool.plan_iterations(args)
    else:
        assert ppo_atari_envpool.plan_iterations(args).num_iterations == 20


def test_adapted_clip_coef_moves_towards_the_ddr_target_in_log_space_and_stays_in_bounds():
    adapt = ppo_atari_envpool.adapted_step_size
    # DDR under the target: the update moved too far for its data, so the epsilon shrinks (and grows in the other case)
    assert adapt(0.1, 25_000.0, 100_000.0, 0.5, (0.01, 0.5)) == pytest.approx(0.1 * 0.25**0.5)
    assert adapt(0.1, 400_000.0, 100_000.0, 0.5, (0.01, 0.5)) == pytest.approx(0.2)
    assert adapt(0.1, 100_000.0, 100_000.0, 0.5, (0.01, 0.5)) == pytest.approx(0.1)  # on target: unchanged
    assert adapt(0.1, 1e12, 100_000.0, 0.5, (0.01, 0.5)) == 0.5 and adapt(0.1, 1.0, 100_000.0, 0.5, (0.01, 0.5)) == 0.01
    assert adapt(8.0, 25_000.0, 100_000.0, 0.5, (0.5, 512.0), sign=-1) == pytest.approx(16.0)  # e.g. EWMA's centre of mass


def test_resume_of_a_checkpoint_from_another_version_exits_2(tmp_path):
    """Right flags, but state dicts this version cannot load (e.g. renamed layers): one line, no traceback."""
    args = dataclasses.asdict(ppo_atari_envpool.validate_and_derive(ppo_atari_envpool.Args(runs_dir=str(tmp_path))))
    rng = {"torch": torch.get_rng_state(), "cuda": []}
    torch.save(
        {
            "args": args,
            "model": {"old.weight": torch.zeros(1)},
            "optimizer": {},
            "iteration": 1,
            "global_step": 2048,
            "rng": rng,
        },
        tmp_path / "checkpoint.pt",
    )
    result = run_script(SCRIPT, "--resume", str(tmp_path / "checkpoint.pt"), "--no-cuda")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --resume: the checkpoint does not fit this version of ppo_atari_envpool.py (RuntimeError)"
    ]


# --------------------------------------------------------------------------------------
# One run over several processes (torchrun, Gloo on the CPU)
# --------------------------------------------------------------------------------------

TORCHRUN_FLAGS = [
    "--no-cuda",
    "--num-envs",
    "4",
    "--num-steps",
    "16",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--total-timesteps",
    "512",
    "--max-episode-steps",
    "40",
    "--metrics-interval",
    "2",
    "--metrics-batch",
    "24",
    "--target-kl",
    "0.5",
]


def reduction_worker(rank, init_file, leaves, data, out_path):
    """One of two processes: the PPO loss of its rows, then the gradient sum of all_ranks_sum_gradients."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rows = (slice(0, 4), slice(4, 7))[rank]
    parameters = [leaf.clone().requires_grad_() for leaf in leaves]  # the same weights in both processes
    minibatch = {name: values[rows] for name, values in data.items()}
    statistics = minibatch_statistics(minibatch)  # over both processes
    loss, stats = ppo_loss(
        *(p[rows] for p in parameters),
        minibatch,
        statistics,
        clip_coef=0.2,
        clip_vloss=True,
        ent_coef=0.01,
        vf_coef=0.5,
        norm_adv=True,
    )
    loss.backward()
    ppo_atari_envpool.all_ranks_sum_gradients(parameters)
    summed_stats = {name: ppo_atari_envpool.all_ranks_sum(value) for name, value in stats.items()}
    torch.save({"gradients": [p.grad for p in parameters], "stats": summed_stats}, f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def concatenation_worker(rank, init_file, out_path):
    """One of two processes with 3 and 1 rows: all_ranks_cat as the metrics gather their sample."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rows = torch.arange(6.0).view(3, 2)[: (3, 1)[rank]] + 10 * rank
    torch.save(ppo_atari_envpool.all_ranks_cat(rows), f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def test_all_ranks_cat_gives_every_process_all_rows_in_process_order(tmp_path):
    torch.multiprocessing.spawn(concatenation_worker, args=(tmp_path / "init", tmp_path / "out.pt"), nprocs=2)
    expected = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [10.0, 11.0]])
    for rank in (0, 1):
        assert torch.equal(torch.load(tmp_path / f"out.pt.{rank}", weights_only=True), expected)
    single = torch.arange(4.0)
    assert ppo_atari_envpool.all_ranks_cat(single) is single  # one process: no copy


def test_two_processes_with_different_reset_steps_get_exactly_the_single_process_gradient(tmp_path):
    """Rows 0-3 on process 0 (3 real transitions), rows 4-6 on process 1 (2): per-process means would weight
    them wrongly; the global-count shares summed over processes give the single-process loss and gradient."""
    generator = torch.Generator().manual_seed(0)
    data = {k: torch.randn(7, generator=generator) for k in ("logprobs", "values", "advantages", "returns")}
    data["valid"] = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    leaves = [torch.randn(7, generator=generator) * 0.1 for _ in range(3)]  # new log-prob, value, entropy
    whole = [leaf.clone().requires_grad_() for leaf in leaves]
    loss, stats = ppo_loss(
        *whole, data, minibatch_statistics(data), clip_coef=0.2, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=True
    )
    loss.backward()
    torch.multiprocessing.spawn(reduction_worker, args=(tmp_path / "init", leaves, data, tmp_path / "out.pt"), nprocs=2)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"out.pt.{rank}", weights_only=True)
        for whole_parameter, gradient in zip(whole, result["gradients"], strict=True):
            assert torch.allclose(gradient, whole_parameter.grad, atol=1e-6)
        for name, value in stats.items():
            assert result["stats"][name].item() == pytest.approx(value.item(), abs=1e-6), name


def test_torchrun_two_processes_stop_together_on_one_sigterm_and_resume_to_identical_weights(tmp_path):
    """Slurm or a user may signal one worker only: the other must stop at the same step, not hang; process 0 alone
    saves and says so, and --resume under torchrun continues to the same total, counting steps like one process. With
    a schedule and a DDR target: each phase's envs split over the processes, and the adapted clip epsilon (from the KL
    averaged over the processes) stays the same everywhere, as the identical weights at the end show."""
    flags = [*with_schedule(TORCHRUN_FLAGS, "0:4x16,0.5:8x8"), "--target-ddr", "1000", "--runs-dir", str(tmp_path)]
    flags[flags.index("--total-timesteps") + 1] = "640"  # 10 iterations: 5 of 4 x 16, then 5 of 8 x 8
    embeddings = ["--save-embeddings", "--embeddings-per-iteration", "1000", "--metrics-batch", "25"]  # all it samples
    flags += [*embeddings, "--save-model", "--checkpoint-interval", "1"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    launcher = subprocess.Popen(
        [*torchrun(2), SCRIPT, *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while not glob.glob(os.path.join(tmp_path, "*", "checkpoint.pt")):
        assert time.time() < deadline and launcher.poll() is None, "no checkpoint"
        time.sleep(0.1)
    workers = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and parent_of(pid) == launcher.pid]
    os.kill(max(workers), signal.SIGTERM)  # one worker only
    stdout, stderr = launcher.communicate(timeout=300)
    assert stdout.count("continue with --resume") == 1, stdout + stderr
    assert "exitcode  : 143" in stderr  # the workers stopped on the signal (128 + 15), none was killed
    run_dir = only_run_dir(tmp_path)  # process 0 alone writes
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert 1 <= checkpoint["iteration"] < 10 and checkpoint["global_step"] == 64 * checkpoint["iteration"]
    assert not os.path.exists(os.path.join(run_dir, "done.json"))
    result = run_torchrun(SCRIPT, 2, "--resume", checkpoint_path, "--no-cuda")
    assert result.returncode == 0 and result.stdout.count("resumed at iteration") == 1, result.stdout + result.stderr
    assert "weights identical on 2 of 2 processes" in result.stdout
    done = json.load(open(os.path.join(run_dir, "done.json")))
    assert done == {"global_step": 640, "iterations": 10}  # one process's count: 5 x 64 steps in each phase
    scalars = read_scalars(run_dir)
    assert PPO_TAGS <= set(scalars), PPO_TAGS - set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [64 * i for i in range(1, 11)]
    # 4 envs, 40-step time limit, 80 steps each in the first phase: a game per env, from both processes
    assert len(scalars["charts/episodic_length"]) >= 4
    flags = json.load(open(os.path.join(run_dir, "args.json")))
    assert flags["num_envs"] == 4 and flags["processes"] == 2  # the global N_envs, and torchrun's process count
    assert [value for _, value in scalars["charts/num_envs"]] == [4] * 5 + [8] * 5
    assert len({value for _, value in scalars["charts/clip_coef"]}) > 1
    # The metrics measure both processes' sample: the DDR that adapts the clip (from the KL averaged over processes) is
    # the logged KL's, which was process 0's own alone before
    kl_behavior, ddr = dict(scalars["metrics/kl_behavior"]), dict(scalars["metrics/ddr"])
    assert sorted(kl_behavior) == [128, 256, 384, 512, 640]
    assert all(ddr[step] == pytest.approx(64 / kl, rel=1e-5) for step, kl in kl_behavior.items())
    # --metrics-batch 25 over 2 processes: 13 and 12 states, not 12 twice; each metrics iteration once across the resume
    iterations = np.load(os.path.join(run_dir, "embeddings.npz"))["iteration"]
    assert np.unique(iterations, return_counts=True)[1].tolist() == [25] * 5


def parent_of(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):  # the process ended meanwhile
        return -1


def test_torchrun_flags_that_do_not_split_exit_2_with_one_line_per_process(tmp_path):
    result = run_torchrun(SCRIPT, 2, "--num-envs", "3", "--num-steps", "16", "--runs-dir", str(tmp_path))
    assert result.returncode != 0
    # each process that gets that far (torchrun stops the other once one fails) says it in one line, exit 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    expected = "error: --num-envs 3 and the minibatch size 12 must split evenly over 2 processes"
    assert 1 <= len(errors) <= 2 and set(errors) == {expected}, result.stderr
    assert "exitcode  : 2" in result.stderr, result.stderr
    assert 'ppo_atari_envpool.py", line' not in result.stderr, result.stderr  # no traceback from the script
    assert not os.listdir(tmp_path)


def test_torchrun_a_run_that_process_0_cannot_open_ends_every_process_without_a_traceback(tmp_path):
    """Process 0 alone opens the run (its directory, its lock): when it cannot, it says why in one line and the other
    processes, waiting for it in start_run, leave with exit 2 instead of a Gloo traceback from their next collective."""
    blocked = tmp_path / "a-file"  # a runs directory that cannot be created: a file stands in its way
    blocked.write_text("")
    result = run_torchrun(SCRIPT, 2, *TORCHRUN_FLAGS, "--runs-dir", str(blocked / "runs"))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode != 0 and len(errors) == 1 and "cannot create the run directory" in errors[0], result.stderr
    assert "[rank1]" not in result.stderr and "exitcode: -6" not in result.stderr, result.stderr  # no traceback, no abort
    assert 'ppo_atari_envpool.py", line' not in result.stderr, result.stderr


def test_a_signal_after_the_last_rollout_still_finishes_the_run(tmp_path):
    """A SIGTERM that lands during the last update: the run has trained its whole budget, so it finishes (done.json)
    instead of exiting 143 to be resumed for nothing; its final checkpoint is written before the model and the video, so
    that a run killed while it finishes resumes to finish (without --checkpoint-interval too)."""
    args = ppo_atari_envpool.validate_and_derive(
        ppo_atari_envpool.Args(num_envs=2, num_steps=16, total_timesteps=64, runs_dir=str(tmp_path))
    )
    quiet = SimpleNamespace(close=lambda: None)
    loop_state = {"iteration": 2, "global_step": 64}
    ppo_atari_envpool.finish_run(str(tmp_path), quiet, quiet, args, loop_state, [], [15], model=torch.nn.Linear(1, 1))
    assert json.load(open(tmp_path / "done.json")) == {"global_step": 64, "iterations": 2}
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (2, 64) and checkpoint["args"]["checkpoint_interval"] == 0


def test_a_run_killed_while_it_films_its_video_resumes_only_to_finish(monkeypatch, tmp_path, tiny_ppo_flags):
    """Without --checkpoint-interval too, the final checkpoint is written before the model and the video: a run that
    dies while it films (e.g. Slurm's SIGKILL after its SIGTERM) resumes there, trains nothing more and finishes."""

    def killed(*_):
        raise RuntimeError("killed while filming")

    monkeypatch.setattr(ppo_atari_envpool, "record_video", killed)
    flags = [*tiny_ppo_flags, "--total-timesteps", "64", "--capture-video", "--runs-dir", str(tmp_path)]
    with pytest.raises(RuntimeError, match="killed while filming"):
        run_main(monkeypatch, ppo_atari_envpool, flags)
    run_dir = only_run_dir(tmp_path)
    assert not os.path.exists(os.path.join(run_dir, "done.json"))
    filmed = []
    monkeypatch.setattr(ppo_atari_envpool, "record_video", lambda agent, args, run_dir: filmed.append(run_dir))
    run_main(monkeypatch, ppo_atari_envpool, ["--resume", os.path.join(run_dir, "checkpoint.pt")])
    assert filmed == [run_dir] and json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 64, "iterations": 2}
    assert [step for step, _ in read_scalars(run_dir)["losses/policy_loss"]] == [32, 64]  # each iteration once


def test_explained_variance_reads_values_against_returns_and_the_grad_norm_is_before_clipping(
    monkeypatch, tmp_path, tiny_ppo_flags
):
    """The call sites of two metrics: explained_variance(predicted = the values, target = the GAE returns), and the
    gradient norm logged as measured before clipping (--max-grad-norm 1e-6: clipped norms would all be 1e-6)."""
    rollouts, calls = [], []
    monkeypatch.setattr(
        ppo_atari_envpool, "compute_gae", lambda *a, **k: rollouts.append(a[1].clone()) or compute_gae(*a, **k)
    )
    explained_variance = metrics.explained_variance
    monkeypatch.setattr(metrics, "explained_variance", lambda *a: calls.append(a) or explained_variance(*a))
    flags = [*tiny_ppo_flags, "--total-timesteps", "64", "--max-grad-norm", "1e-6", "--runs-dir", str(tmp_path)]
    run_main(monkeypatch, ppo_atari_envpool, flags)
    for values, (predicted, target) in zip(rollouts, calls, strict=True):
        assert torch.isin(predicted, values).all() and not torch.isin(target, values).all()
    assert all(value > 1e-5 for _, value in read_scalars(only_run_dir(tmp_path))["metrics/grad_norm"])


def test_the_non_finite_line_names_only_what_is_not_finite(monkeypatch, capsys):
    monkeypatch.setattr(ppo_atari_envpool, "RUN_DIR", "")  # no run opened (an in-process run before this test set it)
    finite, nan = torch.tensor([1.0, 2.0]), torch.tensor([0.5, math.nan])
    ppo_atari_envpool.stop_if_not_finite(3, 96, rewards=finite, losses_or_gradients=finite)  # all finite: goes on
    with pytest.raises(SystemExit) as stopped:
        ppo_atari_envpool.stop_if_not_finite(3, 96, rewards=finite, losses_or_gradients=nan)
    assert stopped.value.code == 1
    assert (
        capsys.readouterr().err
        == "error: non-finite losses_or_gradients at iteration 3 (global step 96); no checkpoint was written\n"
    )


def test_sps_of_a_resumed_run_counts_its_own_steps(monkeypatch, tmp_path, tiny_ppo_flags):
    clock = itertools.count(1_000_000.0)  # every time.time() of the script one second after the last
    monkeypatch.setattr(ppo_atari_envpool, "time", SimpleNamespace(time=lambda: next(clock)))
    flags = [*tiny_ppo_flags, "--total-timesteps", "64", "--checkpoint-interval", "1", "--metrics-interval", "0"]
    run_main(monkeypatch, ppo_atari_envpool, [*flags, "--torch-threads", "1", "--runs-dir", str(tmp_path)])
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    checkpoint["args"]["total_timesteps"] = 128  # the same run, with a larger budget: two more iterations
    torch.save(checkpoint, checkpoint_path)
    os.remove(os.path.join(run_dir, "done.json"))
    run_main(monkeypatch, ppo_atari_envpool, ["--resume", checkpoint_path, "--no-cuda"])
    # 32 steps an iteration, one clock second apart: 32 SPS, without the 64 steps trained before the resume
    assert read_scalars(run_dir)["charts/SPS"] == [(32, 32), (64, 32), (96, 32), (128, 32)]


def test_charts_log_the_rollout_shape_the_metrics_batch_and_the_lr_of_the_rollout_start(monkeypatch, tmp_path, tiny_ppo_flags):
    measured = []
    measure_agent = ppo_atari_envpool.measure_agent
    monkeypatch.setattr(ppo_atari_envpool, "measure_agent", lambda *a: measured.append(len(a[1])) or measure_agent(*a))
    flags = [*tiny_ppo_flags, "--total-timesteps", "64", "--metrics-interval", "1", "--metrics-batch", "10"]
    run_main(monkeypatch, ppo_atari_envpool, [*flags, "--torch-threads", "1", "--runs-dir", str(tmp_path)])
    scalars = read_scalars(only_run_dir(tmp_path))
    assert [value for _, value in scalars["charts/num_steps"]] == [16, 16]  # 2 envs x 16 steps
    assert measured == [10, 10]  # --metrics-batch of the 32 states of a rollout (at most 2 reset steps an env here)
    # annealed from the step at which each rollout started: 0 and 32 of 64
    assert [value for _, value in scalars["charts/learning_rate"]] == pytest.approx([2.5e-4, 1.25e-4])


def test_each_game_logs_its_own_return(monkeypatch, tmp_path, tiny_ppo_flags):
    """A reward of 1 on every real step of 5-step games: every game's return is 5, not a running total."""
    one_reward_per_step(ppo_atari_envpool, monkeypatch)
    flags = [*tiny_ppo_flags, "--total-timesteps", "64", "--max-episode-steps", "5", "--metrics-interval", "0"]
    run_main(monkeypatch, ppo_atari_envpool, [*flags, "--torch-threads", "1", "--runs-dir", str(tmp_path)])
    scalars = read_scalars(only_run_dir(tmp_path))
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    assert len(lengths) >= 8 and set(lengths) == {5}
    assert [value for _, value in scalars["charts/episodic_return"]] == [5.0] * len(lengths)


def test_a_minibatch_that_does_not_split_over_the_processes_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [SCRIPT])
    monkeypatch.setattr(ppo_atari_envpool, "WORLD_SIZE", 2)
    with pytest.raises(SystemExit) as exited:  # 4 envs split; minibatches of 4 x 3 / 4 = 3 states do not
        ppo_atari_envpool.validate_and_derive(ppo_atari_envpool.Args(num_envs=4, num_steps=3, num_minibatches=4))
    assert exited.value.code == 2
    assert "--num-envs 4 and the minibatch size 3 must split evenly over 2 processes" in capsys.readouterr().err


def test_a_life_lost_on_the_time_limit_is_a_termination(monkeypatch, tmp_path, tiny_ppo_flags):
    check_life_lost_on_the_time_limit(monkeypatch, tmp_path, ppo_atari_envpool, tiny_ppo_flags)
