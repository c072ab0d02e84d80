"""ppo_isaacgym.py: Gaussian policy metrics, normalisers, backends, end to end on EnvPool MuJoCo and on a fake Isaac Gym."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import fields
from types import SimpleNamespace

import envpool
import numpy as np
import pytest
import torch
from conftest import (
    PLANTED,
    PPO_TAGS,
    ROOT,
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
from torch.distributions import Normal, kl_divergence

import continuous_tasks
import metrics
import ppo_isaacgym
from ppo_isaacgym import (
    Agent,
    Args,
    RunningMeanStd,
    finish_run,
    learning_rate,
    measure_agent,
    minibatch_statistics,
    normalise_observations,
    ppo_loss,
    scale_rewards,
)

SCRIPT = "ppo_isaacgym.py"
# Ant-v5 with a 20-step limit: every env finishes several episodes in 4 x 16 x 10 steps.
TINY = (
    "--no-cuda --backend envpool --env-id Ant --num-envs 4 --num-steps 16 --total-timesteps 640 --max-episode-steps 20 "
    "--metrics-interval 5 --metrics-batch 32"
).split()
ISAACGYM_INSTALLED = importlib.util.find_spec("isaacgym") is not None


def test_gaussian_kl_matches_torch_and_the_closed_form():
    generator = torch.Generator().manual_seed(0)
    p_mean, q_mean = torch.randn(6, 3, generator=generator), torch.randn(6, 3, generator=generator)
    p_std, q_std = torch.rand(6, 3, generator=generator) + 0.2, torch.rand(6, 3, generator=generator) + 0.2
    expected = kl_divergence(Normal(p_mean.double(), p_std.double()), Normal(q_mean.double(), q_std.double())).sum(-1)
    torch.testing.assert_close(metrics.gaussian_kl(p_mean, p_std, q_mean, q_std), expected)  # in float64
    # one dimension by hand: KL(N(1, 0.5) || N(0, 1)) = log(1 / 0.5) + (0.25 + 1) / 2 - 1/2
    one = metrics.gaussian_kl(torch.ones(1, 1), torch.full((1, 1), 0.5), torch.zeros(1, 1), torch.ones(1, 1))
    assert one.item() == pytest.approx(math.log(2) + 0.625 - 0.5)


def test_agent_is_cleanrl_isaac_gym_network():
    # CleanRL's ppo_continuous_action_isaacgym.py for Isaac Gym's Ant (60 observations, 8 actions), layer by layer: actor
    # and critic each 60 -> 256 -> 256 (tanh), then the mean head 256 -> 8, the value head 256 -> 1 and the 8 log-stds
    encoder = (60 * 256 + 256) + (256 * 256 + 256)
    agent = Agent(obs_dim=60, action_dim=8, separate_networks=True)
    assert sum(p.numel() for p in agent.parameters()) == 2 * encoder + (256 * 8 + 8) + 257 + 8 == 165_137
    assert [type(layer) for layer in agent.actor_encoder] == [torch.nn.Linear, torch.nn.Tanh] * 2


def tiny_agent(seed=0):
    torch.manual_seed(seed)
    return Agent(obs_dim=5, action_dim=2, separate_networks=True)


def test_measure_agent_against_its_own_behaviour_policy():
    agent = tiny_agent()
    obs = torch.randn(64, 5)
    with torch.no_grad():
        actions, _, _, _, means = agent.get_action_and_value(obs)
        std = agent.actor_logstd.exp().expand_as(means)
        measured = measure_agent(agent, obs, actions, means, std, batch_size=1024, dormant_threshold=0.025)
    assert measured["kl_behavior"] == pytest.approx(0.0, abs=1e-6)
    assert measured["ess_pct"] == pytest.approx(100.0)
    # policy variance: over the state-dependent outputs only, the means (the std is one parameter for every state)
    expected_variance = means.double().var(0, unbiased=False).mean()
    assert measured["policy_variance"] == pytest.approx(expected_variance.item())
    assert 1 <= measured["feature_rank"] <= 64 and "feature_rank_critic" in measured


def test_measure_agent_kl_ess_and_ddr_after_a_known_shift():
    agent = tiny_agent()
    obs = torch.randn(4000, 5)
    with torch.no_grad():
        actions, _, _, _, means = agent.get_action_and_value(obs)
        behavior_std = agent.actor_logstd.exp().expand_as(means).clone()
        agent.actor_logstd.fill_(math.log(0.5))  # the update halved the std; the means are unchanged
        measured = measure_agent(agent, obs, actions, means, behavior_std, batch_size=1000, dormant_threshold=0.025)
    kl_per_dim = math.log(0.5) + 1 / (2 * 0.25) - 0.5  # KL(N(m, 1) || N(m, 0.5))
    assert measured["kl_behavior"] == pytest.approx(2 * kl_per_dim, rel=1e-5)
    assert measured["ddr"] == pytest.approx(1000 / (2 * kl_per_dim), rel=1e-5)
    # r = N(a; m, 0.5) / N(a; m, 1) with a ~ N(m, 1): E[r] = 1 and, per dimension,
    # E[r^2] = integral of (4 / sqrt(2 pi)) exp(-3.5 a^2) da = 4 / sqrt(7); with 2 independent
    # dimensions ESS% -> 100 * E[r]^2 / E[r^2] = 100 * 7 / 16 = 43.75 (here a 4000-state estimate).
    assert measured["ess_pct"] == pytest.approx(43.75, rel=0.05)


def test_observation_normalisation_matches_numpy():
    rng = np.random.default_rng(0)
    rms, seen = RunningMeanStd((3,)), []
    for _ in range(4):
        obs = rng.normal([1.0, -2.0, 10.0], [1.0, 0.1, 5.0], size=(32, 3))
        normalised = normalise_observations(torch.tensor(obs, dtype=torch.float32), rms, clip=10.0)
        seen.append(obs)
    seen = np.concatenate(seen)
    np.testing.assert_allclose(rms.mean.numpy(), seen.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var.numpy(), seen.var(0), rtol=1e-3)
    expected = np.clip((obs - rms.mean.numpy()) / np.sqrt(rms.var.numpy() + 1e-8), -10, 10)
    np.testing.assert_allclose(normalised.numpy(), expected, rtol=1e-4, atol=1e-5)
    clipped = normalise_observations(torch.full((1, 3), 1e6), rms, clip=5.0)
    assert torch.all(clipped == 5.0)


def test_normaliser_state_round_trip():
    rms = RunningMeanStd((2,))
    rms.update(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
    restored = RunningMeanStd((2,))
    restored.load_state_dict(rms.state_dict())
    for key in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(restored, key), getattr(rms, key))


def test_reward_scaling_leaves_reset_steps_out_and_restarts_the_return():
    rms = RunningMeanStd()
    valid, dones = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])  # env 0's episode ends; env 1 is on a reset step
    scaled, discounted = scale_rewards(torch.tensor([1.0, 2.0]), valid, dones, torch.tensor([4.0, 0.0]), rms, 0.5, clip=100.0)
    # Only env 0's return 0.5 * 4 + 1 = 3 is counted (env 1 is on a reset step), merged with the prior (0, 1, 1e-4).
    n = 1e-4
    assert rms.count.item() == pytest.approx(1 + n)
    assert rms.mean.item() == pytest.approx(3 / (1 + n))
    variance = (n + 9 * n / (1 + n)) / (1 + n)
    assert rms.var.item() == pytest.approx(variance)
    assert scaled.tolist() == pytest.approx([1 / math.sqrt(variance), 2 / math.sqrt(variance)], rel=1e-4)
    # env 0's episode ended: its return restarts; env 1's reset-step reward (Isaac Gym's is not 0) does not start one
    assert discounted.tolist() == [0.0, 0.0]
    clipped, _ = scale_rewards(torch.tensor([1.0, -2.0]), valid, torch.zeros(2), torch.zeros(2), RunningMeanStd(), 0.5, 5.0)
    assert clipped.tolist() == [5.0, -5.0]  # the std is about 0.014: 70 and -140 without the clip


def test_envpool_mujoco_resets_on_the_step_after_a_truncation():
    """The assumption behind the reset-step mask, checked on EnvPool's MuJoCo itself."""
    envs = envpool.make("Ant-v5", env_type="gymnasium", num_envs=1, seed=0, max_episode_steps=5)
    envs.reset()
    zero = np.zeros((1, 8))
    for _ in range(5):
        _, _, terminated, truncated, info = envs.step(zero)
    assert truncated[0] and not terminated[0] and info["elapsed_step"][0] == 5
    _, reward, terminated, truncated, info = envs.step(zero)
    assert reward[0] == 0 and info["elapsed_step"][0] == 0


@pytest.mark.parametrize("env_id, expected", [("Ant", "Ant-v5"), ("Humanoid-v5", "Humanoid-v5"), ("Hopper-v5", "Hopper-v5")])
def test_auto_backend_without_a_gpu_is_envpool(env_id, expected):
    args = ppo_isaacgym.validate_and_derive(Args(env_id=env_id, runs_dir="/tmp", cuda=False))
    if ISAACGYM_INSTALLED and "-v" not in env_id:
        assert args.backend == "isaacgym"
    else:
        assert args.backend == "envpool" and args.env_id == expected
    assert args.batch_size == 4096 * 16 and args.minibatch_size == 4096 * 8


AUTO_WITH_A_GPU = [("Ant", None, "mjwarp", "Ant"), ("Humanoid-v5", None, "mjwarp", "Humanoid")]
AUTO_WITH_A_GPU += [("Hopper-v5", None, "envpool", "Hopper-v5"), ("Ant", "an old driver", "envpool", "Ant-v5")]


@pytest.mark.skipif(ISAACGYM_INSTALLED, reason="Isaac Gym is installed here: auto picks it for Ant")
@pytest.mark.parametrize("env_id, warp_problem, backend, task", AUTO_WITH_A_GPU)
def test_auto_backend_with_a_gpu_is_mujoco_warp_for_its_tasks(env_id, warp_problem, backend, task, monkeypatch):
    """Without Isaac Gym, a GPU that Warp can use runs Ant and Humanoid on MuJoCo Warp, every other task on EnvPool."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(continuous_tasks, "warp_gpu_problem", lambda: warp_problem)
    args = ppo_isaacgym.validate_and_derive(Args(env_id=env_id, runs_dir="/tmp"))
    assert (args.backend, args.env_id) == (backend, task)


def test_mujoco_warp_tasks_are_the_adapters():
    mujoco_warp_tasks = pytest.importorskip("mujoco_warp_tasks")
    assert continuous_tasks.MJWARP_TASKS == tuple(mujoco_warp_tasks.TASKS)


def test_warp_names_what_keeps_it_off_the_gpu():
    """On this machine Warp finds no CUDA driver: the line says so (on a GPU machine with a recent driver: None)."""
    pytest.importorskip("warp")
    problem = continuous_tasks.warp_gpu_problem()
    if torch.cuda.is_available() and problem is None:
        return
    assert problem.startswith("--backend mjwarp: Warp 1.19.0 cannot use the GPU that torch sees (CUDA driver: ")
    assert "R580" in problem and "--no-cuda" in problem


def test_mujoco_warp_unusable_or_missing_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), "--backend", "mjwarp"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(continuous_tasks, "warp_gpu_problem", lambda: "--backend mjwarp: Warp 1.19.0 cannot use the GPU")
    assert (
        usage_error(ppo_isaacgym.main, monkeypatch, capsys, argv) == "error: --backend mjwarp: Warp 1.19.0 cannot use the GPU"
    )
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "mujoco_warp" else find_spec(name))
    line = usage_error(ppo_isaacgym.main, monkeypatch, capsys, argv)
    install = "pip install mujoco-warp==4.0.0 warp-lang==1.19.0 (or make setup)"
    assert line == f"error: --backend mjwarp: MuJoCo Warp is not installed: {install}"
    assert not os.path.exists(tmp_path / "runs")


def test_tiny_run_writes_every_tag_and_artifact(tmp_path):
    flags = ["--checkpoint-interval", "3", "--save-model", "--save-embeddings", "--embeddings-per-iteration", "10"]
    track, env = fake_wandb(tmp_path)
    result = run_script(SCRIPT, *TINY, "--runs-dir", str(tmp_path), *flags, "--capture-video", *track, env=env)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert "video of one evaluation episode (return " in result.stdout and "videos/eval.mp4" in result.stdout
    assert os.path.basename(run_dir).startswith("Ant-v5__ppo_isaacgym__1__")
    scalars = read_scalars(run_dir)
    assert PPO_TAGS | {"metrics/feature_rank_critic"} <= set(scalars), PPO_TAGS - set(scalars)
    assert [step for step, _ in scalars["metrics/kl_behavior"]] == [320, 640]
    lengths = [length for _, length in scalars["charts/episodic_length"]]
    assert len(lengths) >= 8 and all(1 <= length <= 20 for length in lengths)
    assert all(np.isfinite(value) for _, value in scalars["charts/episodic_return"])
    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["backend"] == "envpool" and args["env_id"] == "Ant-v5" and args["num_iterations"] == 10
    expected = dict(iterations=10, global_step=640, metric_iterations=[5, 10], embedding_rows=20, feature_dim=256)
    checkpoint = check_run_artifacts(run_dir, "ppo_isaacgym", **expected, tracked="fake")  # the video: Ant-v5's, 20 steps
    obs_stats = checkpoint["obs_rms"]
    assert obs_stats["mean"].shape == (105,) and obs_stats["count"].item() == pytest.approx(4 * 161 + 1e-4)
    saved = torch.load(os.path.join(run_dir, "ppo_isaacgym.cleanrl_model"), weights_only=True)
    torch.testing.assert_close(saved["obs_rms"]["mean"], obs_stats["mean"])


# MuJoCo Warp on the CPU (about 50 batched steps a second): 16 worlds of Ant with a 20-step limit, 4 rollouts of 16 steps
WARP_TINY = (
    "--no-cuda --backend mjwarp --env-id Ant --num-envs 16 --num-steps 16 --total-timesteps 1024 --max-episode-steps 20 "
    "--metrics-interval 2 --metrics-batch 64"
).split()


@pytest.mark.skipif(importlib.util.find_spec("mujoco_warp") is None, reason="needs mujoco-warp (requirements.txt)")
def test_mujoco_warp_backend_trains_checkpoints_and_resumes(tmp_path):
    flags = [*WARP_TINY, "--runs-dir", str(tmp_path)]
    interrupt_with_sigterm(SCRIPT, flags)
    checkpoint_path = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    interrupted = torch.load(checkpoint_path, weights_only=True)
    assert 1 <= interrupted["iteration"] < 4 and interrupted["args"]["backend"] == "mjwarp"
    result = run_script(SCRIPT, "--resume", checkpoint_path, "--no-cuda", "--capture-video")  # a flag of how to run
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert os.path.isfile(os.path.join(run_dir, "videos", "eval.mp4"))  # MuJoCo Warp's Ant is Gymnasium's Ant-v5
    scalars = read_scalars(run_dir)
    assert PPO_TAGS <= set(scalars), PPO_TAGS - set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [256 * i for i in range(1, 5)]
    lengths = [length for _, length in scalars["charts/episodic_length"]]
    assert len(lengths) >= 16 and all(1 <= length <= 20 for length in lengths)
    assert all(np.isfinite(value) for _, value in scalars["charts/episodic_return"])
    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["backend"] == "mjwarp" and args["env_id"] == "Ant" and args["num_iterations"] == 4
    assert torch.load(checkpoint_path, weights_only=True)["obs_rms"]["mean"].shape == (105,)  # Gymnasium's Ant-v5


def test_seeded_runs_are_reproducible_and_shared_networks_work(monkeypatch, tmp_path):
    """Two seeded runs in one process: what the first leaves behind (torch's RNG, EnvPool) must not change the second."""
    logged = []
    for name in ("a", "b"):
        flags = [*TINY, "--no-separate-networks", "--seed", "3", "--runs-dir", str(tmp_path / name)]
        run_main(monkeypatch, ppo_isaacgym, flags)
        logged.append(read_scalars(only_run_dir(tmp_path / name)))
    for tag in ("losses/value_loss", "losses/policy_loss", "metrics/grad_kurtosis", "charts/episodic_return"):
        assert logged[0][tag] == logged[1][tag], tag
    assert "metrics/feature_rank_critic" not in logged[0]


def test_bf16_rounds_the_policy_by_at_most_0_01_and_resumes_either_way(monkeypatch, tmp_path):
    """The MLP's hidden layers in bfloat16; the mean, log-std, value and the Gaussian's log-probabilities in float32.
    On the same weights and states, the log-probabilities and values stay within 0.01 of float32's. End to end the
    losses drift further than the pixel scripts' 2 %: the sampled actions move with the rounding of the mean, so the
    two runs collect different rollouts (and MuJoCo amplifies the difference)."""
    torch.manual_seed(0)
    agent, fp32 = ppo_isaacgym.Agent(5, 2, False, bf16=True), ppo_isaacgym.Agent(5, 2, False)
    fp32.load_state_dict(agent.state_dict())
    obs, actions = torch.randn(64, 5), torch.randn(64, 2)
    with ppo_isaacgym.metrics.hidden_activations(agent, torch.nn.Tanh) as activations:
        outputs = agent.get_action_and_value(obs, actions)
    assert {a.dtype for a in activations} == {torch.bfloat16} and {t.dtype for t in outputs} == {torch.float32}
    exact = fp32.get_action_and_value(obs, actions)
    for index in (1, 3):  # the log-probabilities and values (the entropy depends on the log-std alone)
        assert torch.allclose(outputs[index], exact[index], rtol=0, atol=1e-2)
        assert not torch.equal(outputs[index], exact[index])
    flags = [*TINY, "--total-timesteps", "192", "--metrics-interval", "0", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl")
    check_bf16(monkeypatch, tmp_path, ppo_isaacgym, flags, tags, rel_tolerance=0.5)


def test_compiled_path_logs_the_losses_of_the_default_path(monkeypatch, tmp_path):
    """--compile (torch.compile of acting and of the update) changes how the same maths runs, not what is
    learned: on a fixed seed the losses agree up to float rounding."""
    flags = [*TINY, "--total-timesteps", "192", "--metrics-interval", "0", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl")
    variants = {"compiled": ["--compile"]}
    check_same_losses(monkeypatch, tmp_path, ppo_isaacgym, flags, variants, tags, compile_backend="aot_eager")


def test_learning_rate_is_scaled_and_annealed_over_the_planned_steps():
    """The LR that the loop sets at each iteration (the canonical `learning_rate`): --lr-scaling's factor, annealed
    from the iteration's first step over the planned steps: the same floats as the former per-iteration formula."""
    flags = dict(cuda=False, backend="envpool", num_envs=64, num_steps=16, total_timesteps=64 * 16 * 10 + 5)
    args = ppo_isaacgym.validate_and_derive(Args(**flags, lr_scaling="sqrt", lr_reference_envs=16, anneal_lr=True))
    assert args.num_iterations == 10 and args.planned_steps == 10 * 64 * 16
    assert args.scaled_learning_rate == pytest.approx(0.0026 * 2)  # sqrt(64 / 16)
    for iteration in range(1, 11):
        former = args.scaled_learning_rate * (1 - (iteration - 1) / args.num_iterations)
        assert learning_rate(args, args.num_envs, (iteration - 1) * args.batch_size) == former
    args.anneal_lr = False
    assert learning_rate(args, args.num_envs, 5 * args.batch_size) == args.scaled_learning_rate
    assert "planned_steps" not in {field.name for field in fields(Args)}  # the checkpoints of older versions still resume


def test_finish_run_saves_the_loop_state_without_the_interrupted_iteration(tmp_path):
    """Stopped during iteration 4 (its rollout discarded): the checkpoint holds the loop state of 3 iterations and the
    run exits 128 + signal. Finished: done.json from the loop state, the model saved with the observation statistics."""
    args = ppo_isaacgym.validate_and_derive(Args(cuda=False, backend="envpool", num_envs=4, num_steps=16, total_timesteps=640))
    args.save_model, agent, closable = True, tiny_agent(), SimpleNamespace(close=lambda: None)
    modules = {"model": agent, "optimizer": torch.optim.Adam(agent.parameters()), "obs_rms": RunningMeanStd((5,))}
    modules["return_rms"] = RunningMeanStd()
    with pytest.raises(SystemExit) as stopped:
        finish_run(str(tmp_path), closable, closable, args, {"iteration": 4, "global_step": 192}, [], [15], **modules)
    assert stopped.value.code == 128 + 15 and not (tmp_path / "done.json").exists()
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (3, 192) and set(modules) <= set(checkpoint)
    finish_run(str(tmp_path), closable, closable, args, {"iteration": 10, "global_step": 640}, [], [], **modules)
    assert json.load(open(tmp_path / "done.json")) == {"global_step": 640, "iterations": 10}
    assert set(torch.load(tmp_path / "ppo_isaacgym.cleanrl_model", weights_only=True)) == {"model", "obs_rms"}


def assert_planted_statistics_continued(checkpoint: dict, num_envs: int, resumed_steps: int) -> None:
    """After `resumed_steps` steps of `num_envs` envs from planted statistics: the observation normaliser counts every
    observation, the first reset's included (exact: sums of whole numbers in float64); the return normaliser the real
    transitions only, at most all of them and at least half (a reset step, left out, follows a real step that ended an
    episode). The new values (observations and returns of a few tens at most) weigh under 1 % against the planted
    count: the means stay within 1 of the planted 100, not near a fresh run's."""
    obs_stats, return_stats = checkpoint["obs_rms"], checkpoint["return_rms"]
    assert obs_stats["count"].item() == PLANTED["count"] + num_envs * (1 + resumed_steps)
    transitions = num_envs * resumed_steps
    assert PLANTED["count"] + transitions / 2 <= return_stats["count"].item() <= PLANTED["count"] + transitions
    for stats in (obs_stats, return_stats):
        assert abs(stats["mean"].mean().item() - PLANTED["mean"]) < 1.0


def test_sigterm_checkpoints_and_resume_reaches_the_same_total(monkeypatch, tmp_path):
    """In-process, SIGTERM after the first iteration (a real signal to real processes: the torchrun test)."""
    flags = [*TINY, "--runs-dir", str(tmp_path)]
    flags[flags.index("--total-timesteps") + 1] = "256"  # 4 iterations
    stop_after_first_checkpoint(monkeypatch, ppo_isaacgym, flags)
    checkpoint_path = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    interrupted = torch.load(checkpoint_path, weights_only=True)
    assert (interrupted["iteration"], interrupted["global_step"]) == (1, 64)
    plant_statistics(checkpoint_path, "obs_rms", "return_rms")

    run_main(monkeypatch, ppo_isaacgym, ["--resume", checkpoint_path, "--checkpoint-interval", "1000"])
    final = torch.load(checkpoint_path, weights_only=True)
    assert_optimizer_went_on(final)
    assert final["iteration"] == 4 and final["global_step"] == 256
    # the normalisers continued from the checkpoint's, not restarted: TINY's 4 envs x 16 steps per resumed iteration
    assert_planted_statistics_continued(final, 4, 16 * 3)
    steps = [step for step, _ in read_scalars(only_run_dir(tmp_path))["charts/SPS"]]
    assert steps == [64, 128, 192, 256]


BAD_FLAGS = [
    (["--env-id", "Breakout-v5"], "is not an EnvPool MuJoCo task"),
    (["--backend", "envpool", "--env-id", "FetchReach-v4"], "is not an EnvPool MuJoCo task"),
    (["--backend", "envpool", "--env-id", "CheetahRun-v1"], "is not an EnvPool MuJoCo task"),  # dm_control's
    ("--backend mjwarp --env-id Hopper-v5".split(), "--env-id 'Hopper-v5' is not a MuJoCo Warp task (known: Ant, Humanoid)"),
    (
        "--backend envpool --env-id Hopper-v4 --capture-video".split(),  # Gymnasium's v4 models differ (Pusher needs mujoco<3)
        "--capture-video renders Gymnasium's MuJoCo v5 tasks (on envpool or mjwarp), not Hopper-v4 on envpool",
    ),
    (
        "--num-minibatches 3 --num-envs 4 --num-steps 8".split(),
        "--num-minibatches 3 does not divide the batch (num_envs * num_steps = 32)",
    ),
    (["--num-envs", "0"], "--num-envs must be finite and > 0, got 0"),
    (["--obs-clip", "0"], "--obs-clip must be finite and > 0"),
    (["--max-episode-steps", "-1"], "--max-episode-steps must be finite and > 0, got -1"),
    (["--minibatch-size", "100000"], "--minibatch-size 100000 does not divide the batch (num_envs * num_steps = 65536)"),
    (["--minibatch-size", "0"], "--minibatch-size must be finite and > 0"),
    (["--target-kl", "0"], "--target-kl must be finite and > 0"),
    (["--total-timesteps", "100"], "smaller than one batch"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--resume", "/no/such/checkpoint.pt"], "no such checkpoint file"),
    (["--runs-dir", "/proc/forbidden"], "--runs-dir"),
    (["--torch-threads", "0"], "--torch-threads must be finite and > 0, got 0"),
    (["--seed", "-1"], "--seed -1, "),  # the env seeds are C ints: EnvPool's traceback once the run was made
    (["--seed", "2147483647"], "iterations: env seeds ("),
    (
        ["--seed", "2147479097", "--runs-dir", "/proc/forbidden"],
        "--seed 2147479097, 457 iterations: env seeds",
    ),  # 457 iterations, 4096 envs: 2**31 the last env seed
    (["--torch-threads", "2147483648"], "--torch-threads must be below 2**31"),
    (["--torch-threads", str((os.cpu_count() or 1) + 1)], "CPUs here"),  # 100,000 threads: a segfault
    (["--cudagraphs"], "--cudagraphs needs --compile and CUDA"),
    (["--save-embeddings", "--metrics-interval", "0"], "--save-embeddings needs --metrics-interval > 0"),
    (["--compile", "--cudagraphs", "--no-cuda"], "--cudagraphs needs --compile and CUDA"),
]
if not ISAACGYM_INSTALLED:
    BAD_FLAGS.append((["--backend", "isaacgym"], "Isaac Gym is not installed (it is not on PyPI)"))


@pytest.mark.parametrize("flags, fragment", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(ppo_isaacgym.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags])
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")


# In a test process where mujoco was imported with MUJOCO_GL=egl (an earlier test), "nonsense" is met by Gymnasium's
# viewer instead, which raises in __init__, then in __del__ (Gymnasium 1.x): not a user's case (one setting a process)
VIEWER_DEL = "Exception ignored in. <function OffScreenViewer.__del__"


@pytest.mark.filterwarnings(f"ignore:{VIEWER_DEL}:pytest.PytestUnraisableExceptionWarning")
def test_capture_video_where_mujoco_cannot_render_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUJOCO_GL", "nonsense")  # what a machine without OpenGL meets in the first frame: an error
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), "--backend", "envpool", "--capture-video"]
    line = usage_error(ppo_isaacgym.main, monkeypatch, capsys, argv)
    assert line.startswith("error: --capture-video: MuJoCo cannot render with MUJOCO_GL=nonsense (")  # mujoco's or
    assert line.count("nonsense") == 2  # Gymnasium's words, as either has met the setting first in this process
    assert line.endswith("egl needs libEGL, osmesa libOSMesa") and not os.path.exists(tmp_path / "runs")


def test_capture_video_with_glfw_and_no_display_says_so_in_one_line(tmp_path):
    """A user's MUJOCO_GL=glfw on a machine without a display: GLFW warns at each call that fails before it raises; the
    run exits 2 with the one line alone."""
    env = {"MUJOCO_GL": "glfw", "DISPLAY": "", "WAYLAND_DISPLAY": ""}
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path / "runs"), "--backend", "envpool", "--capture-video", env=env)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: --capture-video: MuJoCo cannot render with MUJOCO_GL=glfw (")


# Robot pixels of a frame: the bodies' tan (red well above blue), in neither the floor's squares nor the sky.
FILM_ROBOT_MOVED_6_M = """
import sys, types, continuous_tasks
for backend, task in (("envpool", "Ant-v5"), ("mjwarp", "Humanoid")):
    env = continuous_tasks.video_env(types.SimpleNamespace(backend=backend, env_id=task, max_episode_steps=1000))
    env.reset(seed=0)
    frames = [env.render()]
    qpos = env.unwrapped.data.qpos.copy()
    qpos[0] += 6.0
    env.unwrapped.set_state(qpos, env.unwrapped.data.qvel)
    frames.append(env.render())
    print(*(int(((f[..., 0].astype(int) - f[..., 2] > 60) & (f[..., 0] > 120)).sum()) for f in frames))
"""


def test_the_video_follows_the_robot():
    """--capture-video films through the model's tracking camera: 6 m further, the robot is still in the picture (it is
    out of Gymnasium 1.4's default camera's). In a process of its own: test_capture_video_where_mujoco_cannot_render
    leaves MUJOCO_GL=nonsense in this one's rendering."""
    result = subprocess.run([sys.executable, "-c", FILM_ROBOT_MOVED_6_M], cwd=ROOT, capture_output=True, text=True)
    counts = [list(map(int, line.split())) for line in result.stdout.splitlines()]  # at the start and 6 m further
    assert result.returncode == 0 and len(counts) == 2, result.stderr  # the Ant's, then the Humanoid's
    assert all(start > 500 and moved > start / 2 for start, moved in counts), counts


@pytest.mark.parametrize("flags", [["--num-envs", "eight"], ["--backend", "bullet"], ["--no-such-flag", "1"]])
def test_flags_tyro_rejects_exit_2_naming_the_flag(tmp_path, monkeypatch, capsys, flags):
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags]
    assert flags[0] in tyro_error(ppo_isaacgym.main, monkeypatch, capsys, argv)
    assert not os.path.exists(tmp_path / "runs")


def test_resume_rejects_a_file_that_is_not_a_checkpoint(tmp_path, monkeypatch, capsys):
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    other_script = tmp_path / "ppo_atari_checkpoint.pt"  # right keys, but another script's flags
    torch.save({"args": {"clip_coef": 0.1}, "model": {}, "optimizer": {}, "iteration": 1, "rng": {}}, other_script)
    cases = ((tmp_path / "junk.pt", "not a readable checkpoint"), (other_script, "is not a checkpoint.pt of ppo_isaacgym.py"))
    for path, fragment in cases:
        assert fragment in usage_error(ppo_isaacgym.main, monkeypatch, capsys, [SCRIPT, "--resume", str(path)])


def test_a_bad_flag_from_the_shell(tmp_path):
    """The real command line: one line, exit 2 (tyro's refusals and the other checks: in-process, above)."""
    flags = ["--num-minibatches", "3"]
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and flags[0] in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


@pytest.mark.skipif(ISAACGYM_INSTALLED, reason="Isaac Gym is installed here")
def test_isaacgym_backend_without_isaacgym_from_the_shell(tmp_path):
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), "--backend", "isaacgym", "--env-id", "Ant")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "developer.nvidia.com/isaac-gym" in result.stderr and "--backend envpool" in result.stderr


# --------------------------------------------------------------------------------------
# --backend isaacgym on a fake Isaac Gym: tests/fake_isaacgym mirrors the parts of Isaac Gym and IsaacGymEnvs 1.5.1 that
# continuous_tasks.py uses (make, isaacgym_task_map, VecTask's step and reset), with episodes of known lengths
# --------------------------------------------------------------------------------------
# Only on the path of the processes these tests start: this one has imported torch, after which Isaac Gym (and the fake)
# refuse to load.
FAKE_ISAACGYM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_isaacgym")
WITH_FAKE_ISAACGYM = {"PYTHONPATH": os.pathsep.join([FAKE_ISAACGYM, os.environ["PYTHONPATH"]]), "CUDA_VISIBLE_DEVICES": ""}
MAX_EPISODE_STEPS_LINE = (
    "error: --max-episode-steps applies to --backend envpool and mjwarp (Isaac Gym tasks set their own episode length)"
)
# One process for the cases that stop before training (a process spends seconds importing torch and EnvPool): which
# backend and task `auto` picks, main()'s exit status and stderr for flags it must refuse, and the fake's import rule.
FAKE_ISAACGYM_CASES = """
import contextlib, importlib, io, json, sys
import ppo_isaacgym
out = {"picks": {}, "exits": {}}
for env_id in ("Ant", "Ant-v5", "Humanoid", "Hopper-v5"):
    args = ppo_isaacgym.validate_and_derive(ppo_isaacgym.Args(env_id=env_id, cuda=False))
    out["picks"][env_id] = [args.backend, args.env_id]
refused = (["--backend", "isaacgym", "--env-id", "Cartpole"], ["--env-id", "Cartpole"], ["--env-id", "HumanoidAMP"])
for flags in (*refused, ["--max-episode-steps", "20"], ["--capture-video"]):
    sys.argv, stderr, code = ["ppo_isaacgym.py", "--runs-dir", "/nonexistent/runs", *flags], io.StringIO(), None
    try:
        with contextlib.redirect_stderr(stderr):
            ppo_isaacgym.main()
    except SystemExit as stop:
        code = stop.code
    out["exits"][" ".join(flags)] = [code, stderr.getvalue()]
del sys.modules["isaacgym.gymdeps"]  # loaded again, now after torch
try:
    importlib.import_module("isaacgym.gymdeps")
except ImportError as error:
    out["after_torch"] = str(error)
print(json.dumps(out))
"""


def test_auto_backend_picks_an_installed_isaac_gym_for_its_tasks():
    env = {**os.environ, **WITH_FAKE_ISAACGYM}
    command = [sys.executable, "-c", FAKE_ISAACGYM_CASES]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    # Ant and Humanoid are one task on every backend (Gymnasium's names too); a task Isaac Gym lacks stays on EnvPool
    picks = {"Ant": ["isaacgym", "Ant"], "Ant-v5": ["isaacgym", "Ant"], "Humanoid": ["isaacgym", "Humanoid"]}
    assert out["picks"] == {**picks, "Hopper-v5": ["envpool", "Hopper-v5"]}
    isaacgym_task = "error: --env-id 'Cartpole' is not an Isaac Gym task (known: Ant, Humanoid, HumanoidAMP)\n"
    other_resets = "error: --env-id HumanoidAMP: its resets do not follow IsaacGymEnvs' VecTask protocol, which "
    other_resets += "ppo_isaacgym.py needs\n"
    # auto with a task outside the map: EnvPool's line, without the hint to install Isaac Gym (it is installed)
    envpool_task = "error: --env-id 'Cartpole' is not an EnvPool MuJoCo task (e.g. Ant-v5, Humanoid-v5, HalfCheetah-v5, "
    envpool_task += "Hopper-v5, Walker2d-v5)\n"
    assert out["exits"] == {
        "--backend isaacgym --env-id Cartpole": [2, isaacgym_task],
        "--env-id Cartpole": [2, envpool_task],
        "--env-id HumanoidAMP": [2, other_resets],
        "--max-episode-steps 20": [2, MAX_EPISODE_STEPS_LINE + "\n"],  # auto picked Isaac Gym for the default Ant
        "--capture-video": [
            2,
            "error: --capture-video renders Gymnasium's MuJoCo v5 tasks (on envpool or mjwarp), not Ant on isaacgym\n",
        ],
    }
    # The fake keeps Isaac Gym's rule that ppo_isaacgym.py's first lines are there for: it loads before torch or not at all
    assert out["after_torch"].startswith("PyTorch was imported before isaacgym modules")


def test_the_suite_imports_where_isaac_gym_is_installed():
    # conftest.py imports torch; without Isaac Gym loaded before it, this file's `import ppo_isaacgym` would fail there
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_ppo_isaacgym.py"]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **WITH_FAKE_ISAACGYM}, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:]  # 2: an error while collecting


def test_isaacgym_backend_refuses_max_episode_steps_from_the_shell(tmp_path):
    flags = ["--runs-dir", str(tmp_path / "runs"), "--backend", "isaacgym", "--env-id", "Humanoid", "--max-episode-steps", "9"]
    result = run_script(SCRIPT, *flags, env=WITH_FAKE_ISAACGYM)
    assert result.returncode == 2 and result.stderr == MAX_EPISODE_STEPS_LINE + "\n", result.stderr
    assert not os.path.exists(tmp_path / "runs")


# 4 envs of the fake Ant x 16 steps x 3 iterations, the metrics on the last two: a few seconds.
ISAACGYM_TINY = (
    "--no-cuda --backend isaacgym --env-id Ant --num-envs 4 --num-steps 16 --total-timesteps 192 --metrics-interval 2 "
    "--metrics-batch 32"
).split()
# The fake Ant's episodes by its rules (tests/fake_isaacgym/isaacgymenvs/tasks/ant.py): env i % 4 = 0 times out at
# progress 11 (episodeLength 12 - 1), i % 4 = 1, 2, 3 fall at progress 7, 4, 3 whatever the actions. IsaacGymEnvs resets
# an env on the step after its episode ended (progress 0 after that step), and every env on the first step (VecTask's
# reset_buf starts at 1). So env i's episodes end on the control steps that are multiples of FAKE_ANT_LENGTHS[i] + 1,
# each with FAKE_ANT_LENGTHS[i] steps whose action moved the episode's state (the reset step's did not).
FAKE_ANT_LENGTHS = (11, 7, 4, 3)


def fake_ant_episodes(num_envs, steps):
    """(control step, env, length) of the episodes that end within the fake's first `steps` steps, by step then env."""
    lengths = [FAKE_ANT_LENGTHS[i % 4] for i in range(num_envs)]
    return [(k, i, n) for k in range(1, steps + 1) for i, n in enumerate(lengths) if k % (n + 1) == 0]


def ledger_episodes(path, num_envs):
    """(control step, env, return, length) of the episodes the fake recorded, over their steps that were not reset
    steps, the return summed in float32 as the script does; and the number of steps the fake took."""
    lines = [json.loads(line) for line in open(path)]
    episodes, returns, lengths = [], np.zeros(num_envs, np.float32), np.zeros(num_envs, np.int64)
    for k, line in enumerate(lines, start=1):
        for i in range(num_envs):
            if not line["reset"][i]:
                returns[i] += np.float32(line["reward"][i])
                lengths[i] += 1
            if line["done"][i]:
                episodes.append((k, i, float(returns[i]), int(lengths[i])))
                returns[i], lengths[i] = 0.0, 0
    return episodes, len(lines)


def test_isaacgym_backend_trains_on_the_fake_and_logs_its_episodes(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    env = {**WITH_FAKE_ISAACGYM, "FAKE_ISAACGYM_LEDGER": str(ledger)}
    result = run_script(SCRIPT, *ISAACGYM_TINY, "--runs-dir", str(tmp_path / "runs"), env=env)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    assert os.path.basename(run_dir).startswith("Ant__ppo_isaacgym__1__")
    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["backend"] == "isaacgym" and args["env_id"] == "Ant" and args["num_iterations"] == 3
    scalars = read_scalars(run_dir)
    assert PPO_TAGS | {"metrics/feature_rank_critic"} <= set(scalars), PPO_TAGS - set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [64, 128, 192]
    assert [step for step, _ in scalars["metrics/kl_behavior"]] == [128, 192]
    for tag in PPO_TAGS - {"losses/explained_variance"}:
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag

    # The fake keeps to the rules derived above; the script logs one return and length per episode, at its last step.
    recorded, fake_steps = ledger_episodes(ledger, num_envs=4)
    assert [(k, env, length) for k, env, _, length in recorded] == fake_ant_episodes(num_envs=4, steps=fake_steps)
    # The script's 48 steps are the fake's last 48: an adapter that took the first (reset) step inside reset() adds one.
    offset = fake_steps - 48
    recorded = [((k - offset) * 4, env, value, length) for k, env, value, length in recorded if k > offset]
    returns, lengths = scalars["charts/episodic_return"], scalars["charts/episodic_length"]
    assert [step for step, _ in returns] == [step for step, _ in lengths] == [step for step, *_ in recorded]
    logged = [(value, length) for (_, value), (_, length) in zip(returns, lengths, strict=True)]
    expected = [(value, length) for _, _, value, length in recorded]
    # The reset steps masked out: returns to float32 rounding, lengths exactly. Each env's first episode too: VecTask's
    # first step resets every env, which IsaacGymTasks.reset takes (the script's first step would count it otherwise).
    for (value, length), (expected_value, expected_length), episode in zip(logged, expected, recorded, strict=True):
        assert length == expected_length and value == pytest.approx(expected_value, rel=1e-6, abs=1e-6), episode


# --------------------------------------------------------------------------------------
# One run over several processes (torchrun, Gloo on the CPU)
# --------------------------------------------------------------------------------------

TORCHRUN_FLAGS = [*TINY, "--target-kl", "0.5"]  # 2 minibatches of 32: 16 rows per process


LOSS_COEFFICIENTS = dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.01, vf_coef=2.0, norm_adv=True)


def reduction_worker(rank, init_file, leaves, data, out_path):
    """One of two processes: the PPO loss of its rows, then the gradient sum of all_ranks_sum_gradients."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rows = (slice(0, 4), slice(4, 7))[rank]
    parameters = [leaf.clone().requires_grad_() for leaf in leaves]  # the same weights in both processes
    minibatch = {name: values[rows] for name, values in data.items()}
    statistics = minibatch_statistics(minibatch)  # over both processes
    loss, stats = ppo_loss(*(p[rows] for p in parameters), minibatch, statistics, **LOSS_COEFFICIENTS)
    loss.backward()
    ppo_isaacgym.all_ranks_sum_gradients(parameters)
    summed_stats = {name: ppo_isaacgym.all_ranks_sum(value) for name, value in stats.items()}
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


def normaliser_worker(rank, init_file, updates, out_path):
    """One of two processes: the same normaliser updates as one process, on this process's rows only."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rows = (slice(0, 5), slice(5, 8))[rank]  # unequal shares
    obs_rms, return_rms = RunningMeanStd((3,)), RunningMeanStd()
    for obs, returns, valid in updates:
        normalise_observations(obs[rows], obs_rms, clip=10.0)
        return_rms.update(returns[rows], valid[rows])
    torch.save({"obs_rms": obs_rms.state_dict(), "return_rms": return_rms.state_dict()}, f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def test_two_processes_update_the_normalisers_like_one_process_on_all_their_data(tmp_path):
    """The observation and return statistics merge every process's moments: each process ends with the
    statistics of one process that saw the concatenated batches (reset steps left out of the returns')."""
    generator = torch.Generator().manual_seed(0)
    scale, centre = torch.tensor([1.0, 0.1, 5.0]), torch.tensor([1.0, -2.0, 10.0])
    updates = []
    for _ in range(3):  # observations, returns, valid
        obs = torch.randn(8, 3, generator=generator) * scale + centre
        updates.append((obs, torch.randn(8, generator=generator) * 3 + 1, (torch.rand(8, generator=generator) > 0.3).float()))
    obs_rms, return_rms = RunningMeanStd((3,)), RunningMeanStd()
    for obs, returns, valid in updates:
        normalise_observations(obs, obs_rms, clip=10.0)
        return_rms.update(returns, valid)
    torch.multiprocessing.spawn(normaliser_worker, args=(tmp_path / "init", updates, tmp_path / "out.pt"), nprocs=2)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"out.pt.{rank}", weights_only=True)
        for name, rms in (("obs_rms", obs_rms), ("return_rms", return_rms)):
            for key, value in rms.state_dict().items():
                torch.testing.assert_close(result[name][key], value, rtol=1e-12, atol=1e-12)
    assert return_rms.count.item() < 24  # some reset steps were left out


@pytest.mark.skipif(importlib.util.find_spec("mujoco_warp") is None, reason="needs mujoco-warp (requirements.txt)")
def test_torchrun_two_processes_on_mujoco_warp_keep_identical_weights(tmp_path):
    """Each process simulates its 8 of the 16 worlds (on its own GPU under CUDA; here both on the CPU)."""
    flags = [
        *WARP_TINY,
        "--num-steps",
        "8",
        "--total-timesteps",
        "256",
        "--max-episode-steps",
        "5",
        "--runs-dir",
        str(tmp_path),
    ]
    result = run_torchrun(SCRIPT, 2, *flags)
    assert result.returncode == 0, result.stderr
    assert "weights identical on 2 of 2 processes" in result.stdout
    run_dir = only_run_dir(tmp_path)
    assert json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 256, "iterations": 2}
    assert len(read_scalars(run_dir)["charts/episodic_length"]) >= 32  # 16 worlds, 5-step limit, 16 steps each


def test_torchrun_sigterm_checkpoints_once_and_resume_counts_steps_like_one_process_with_identical_weights(tmp_path):
    flags = [*TORCHRUN_FLAGS, "--runs-dir", str(tmp_path), "--save-model"]
    stdout = interrupt_with_sigterm(SCRIPT, flags, nproc=2)  # 10 iterations
    assert stdout.count("continue with --resume") == 1  # process 0 alone saves and says so
    run_dir = only_run_dir(tmp_path)  # process 0 alone writes
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    interrupted = torch.load(checkpoint_path, weights_only=True)
    assert 1 <= interrupted["iteration"] < 10 and interrupted["global_step"] == 64 * interrupted["iteration"]
    plant_statistics(checkpoint_path, "obs_rms", "return_rms")
    result = run_torchrun(SCRIPT, 2, "--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda")
    assert result.returncode == 0, result.stderr
    assert "weights identical on 2 of 2 processes" in result.stdout  # and the normalisers' statistics
    done = json.load(open(os.path.join(run_dir, "done.json")))
    assert done == {"global_step": 640, "iterations": 10}  # one process's count of these flags
    scalars = read_scalars(run_dir)
    assert PPO_TAGS <= set(scalars), PPO_TAGS - set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [64 * i for i in range(1, 11)]
    # 4 envs, 20-step time limit (21 steps with the reset step), 160 steps each, the episode under way at the stop lost
    # (EnvPool cannot save it): at least 5 episodes per env; one process's 2 envs finish at most 14, so both are logged
    assert len(scalars["charts/episodic_length"]) >= 20
    assert json.load(open(os.path.join(run_dir, "args.json")))["num_envs"] == 4  # the global N_envs
    # both processes resumed the checkpoint's statistics and summed their 2 envs' moments: those of 4 envs, not 2 or 8
    final = torch.load(checkpoint_path, weights_only=True)
    assert_planted_statistics_continued(final, 4, 16 * (10 - interrupted["iteration"]))
    saved = torch.load(os.path.join(run_dir, "ppo_isaacgym.cleanrl_model"), weights_only=True)  # --save-model kept
    for key, value in final["obs_rms"].items():  # the model is saved with the observation statistics it was trained on
        assert torch.equal(saved["obs_rms"][key], value), key


def test_flags_that_do_not_split_over_the_torchrun_processes_exit_2_with_one_line(monkeypatch, capsys):
    line = refused_over_two_processes(
        ppo_isaacgym, monkeypatch, capsys, ppo_isaacgym.Args(backend="envpool", num_envs=3, num_steps=16, cuda=False)
    )
    assert line == "error: --num-envs 3 and the minibatch size 24 must split evenly over 2 processes"


def test_isaac_gym_time_outs_are_truncations_not_terminations():
    tasks = object.__new__(continuous_tasks.IsaacGymTasks)  # its step alone, on a stand-in for IsaacGymEnvs' VecTask
    done, time_out = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 1, 0])  # a fall, a time-out, neither
    tasks.envs = SimpleNamespace(step=lambda a: ({"obs": torch.zeros(3, 2)}, torch.zeros(3), done, {"time_outs": time_out}))
    _, _, terminations, truncations = tasks.step(torch.zeros(3, 1))
    assert terminations.tolist() == [1.0, 0.0, 0.0] and truncations.tolist() == [0.0, 1.0, 0.0]


def test_the_gaussian_policy_sums_log_probability_and_entropy_over_the_action_dimensions():
    agent = ppo_isaacgym.Agent(obs_dim=5, action_dim=2, separate_networks=False)
    with torch.no_grad():  # N(0, 1) in both dimensions
        agent.actor_mean.weight.zero_(), agent.actor_mean.bias.zero_(), agent.actor_logstd.zero_()
    _, logprob, entropy, _, _ = agent.get_action_and_value(torch.zeros(1, 5), torch.zeros(1, 2))
    assert logprob.item() == pytest.approx(-np.log(2 * np.pi))  # 2 x -0.5 log(2 pi)
    assert entropy.item() == pytest.approx(1 + np.log(2 * np.pi))  # 2 x 0.5 (1 + log(2 pi))


def test_a_rollout_discarded_by_sigterm_leaves_the_normalisers_as_the_last_iteration_left_them(monkeypatch, tmp_path):
    argv = [*TINY, "--runs-dir", str(tmp_path)]
    check_a_discarded_rollout_leaves_the_normalisers(monkeypatch, ppo_isaacgym, argv, ["obs_rms", "return_rms"])
