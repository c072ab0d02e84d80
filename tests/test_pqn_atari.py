"""pqn_atari.py: Q(lambda) targets, exploration and loss on hand-made tensors; tiny end-to-end runs."""

import json
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_optimizer_went_on,
    check_bf16,
    check_life_lost_on_the_time_limit,
    check_run_artifacts,
    check_same_losses,
    fake_wandb,
    interrupt_with_sigterm,
    only_run_dir,
    read_scalars,
    run_main,
    run_script,
    tyro_error,
    usage_error,
    with_schedule,
)

import pqn_atari
from pqn_atari import compute_gradients, compute_q_lambda_targets, epsilon_greedy, epsilon_schedule, masked_mean, td_loss

SCRIPT = "pqn_atari.py"

# Every tag of the SPEC that pqn_atari.py writes.
PQN_TAGS = {
    *(f"charts/{name}" for name in "episodic_return episodic_length SPS learning_rate epsilon".split()),
    *("losses/td_loss", "losses/q_values"),
    *(f"metrics/{name}" for name in "feature_rank dormant_pct weight_norm grad_kurtosis grad_norm q_mean".split()),
}


def targets(rewards, next_max_q, terminations, truncations, valid, gamma=0.5, q_lambda=0.5):
    """Columns are environments: each argument is a list of rows (T, N)."""
    rows = [torch.tensor(xs, dtype=torch.float32) for xs in (rewards, next_max_q, terminations, truncations, valid)]
    return compute_q_lambda_targets(*rows, gamma, q_lambda)


# --------------------------------------------------------------------------------------
# Q(lambda) targets
# --------------------------------------------------------------------------------------


def test_q_lambda_targets_termination_and_reset_step():
    # gamma = lambda = 0.5; two environments side by side (rows are time steps).
    # env 0: t=1 terminates (a lost life), t=2 is EnvPool's reset step, the last row.
    #   t=2: reset step -> 0 (masked)
    #   t=1: termination, no bootstrap: G = r = 2
    #   t=0: 1 + 0.5 * (0.5 * maxQ(s_1)=4 + 0.5 * G_1=2) = 1 + 0.5 * 3 = 2.5
    # env 1: no episode end.
    #   t=2 (last row): 2 + 0.5 * maxQ(next_obs)=4 = 4
    #   t=1: 0 + 0.5 * (0.5 * 4 + 0.5 * 4) = 2
    #   t=0: 1 + 0.5 * (0.5 * 6 + 0.5 * 2) = 3
    rewards, next_max_q = [[1, 1], [2, 0], [0, 2]], [[4, 6], [8, 4], [6, 4]]
    terminations, truncations, valid = [[0, 0], [1, 0], [0, 0]], [[0, 0], [0, 0], [0, 0]], [[1, 1], [1, 1], [0, 1]]
    result = targets(rewards, next_max_q, terminations, truncations, valid)
    assert result[:, 0].tolist() == pytest.approx([2.5, 2.0, 0.0])
    assert result[:, 1].tolist() == pytest.approx([3.0, 2.0, 4.0])


def test_q_lambda_targets_truncation_bootstraps_from_the_last_observation():
    # env 0 of the test above, but t=1 is a time-limit truncation: next_max_q[1] = 8 is
    # max_a Q of the real last observation (stored as the reset step's observation).
    #   t=1: 2 + 0.5 * 8 = 6 (full bootstrap, no lambda continuation into the reset step;
    #        with one it would be 2 + 0.5 * (0.5 * 8 + 0.5 * 0) = 4)
    #   t=0: 1 + 0.5 * (0.5 * 4 + 0.5 * 6) = 3.5
    no_termination, truncation_at_1, reset_at_2 = [[0], [0], [0]], [[0], [1], [0]], [[1], [1], [0]]
    result = targets([[1], [2], [0]], [[4], [8], [6]], no_termination, truncation_at_1, reset_at_2)
    assert result[:, 0].tolist() == pytest.approx([3.5, 6.0, 0.0])
    # A truncation in the last row bootstraps from max_a Q(next_obs), the real last observation.
    result = targets(rewards=[[1]], next_max_q=[[8]], terminations=[[0]], truncations=[[1]], valid=[[1]])
    assert result[:, 0].tolist() == pytest.approx([5.0])
    # A termination that is also a truncation does not bootstrap.
    result = targets(rewards=[[1]], next_max_q=[[8]], terminations=[[1]], truncations=[[1]], valid=[[1]])
    assert result[:, 0].tolist() == pytest.approx([1.0])


def test_q_lambda_limits_are_one_step_td_and_discounted_return():
    rewards, next_max_q = [[1], [2], [3]], [[10], [20], [30]]
    no_end = dict(terminations=[[0], [0], [0]], truncations=[[0], [0], [0]], valid=[[1], [1], [1]])
    # lambda = 0: one-step targets r_t + gamma * max_a Q(s_{t+1})
    one_step = targets(rewards, next_max_q, **no_end, gamma=0.5, q_lambda=0.0)
    assert one_step[:, 0].tolist() == pytest.approx([6.0, 12.0, 18.0])
    # lambda = 1: discounted rewards bootstrapped once, after the last row
    monte_carlo = targets(rewards, next_max_q, **no_end, gamma=0.5, q_lambda=1.0)
    # t=2: 3 + 15 = 18; t=1: 2 + 9 = 11; t=0: 1 + 5.5 = 6.5
    assert monte_carlo[:, 0].tolist() == pytest.approx([6.5, 11.0, 18.0])


# --------------------------------------------------------------------------------------
# Exploration and loss
# --------------------------------------------------------------------------------------


def test_epsilon_schedule_start_middle_end():
    assert epsilon_schedule(0, 1.0, 0.01, 1000) == pytest.approx(1.0)
    assert epsilon_schedule(500, 1.0, 0.01, 1000) == pytest.approx(0.505)
    assert epsilon_schedule(1000, 1.0, 0.01, 1000) == pytest.approx(0.01)
    assert epsilon_schedule(10**9, 1.0, 0.01, 1000) == pytest.approx(0.01)
    assert epsilon_schedule(0, 1.0, 0.01, 0) == pytest.approx(0.01)  # --exploration-fraction 0


def test_epsilon_greedy_is_greedy_at_zero_and_uniform_at_one():
    torch.manual_seed(0)
    q_values = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).repeat(4000, 1)
    assert (epsilon_greedy(q_values, 0.0) == 1).all()
    counts = torch.bincount(epsilon_greedy(q_values, 1.0), minlength=4).double() / 4000
    assert counts.tolist() == pytest.approx([0.25] * 4, abs=0.04)
    # epsilon 0.5: greedy half the time, plus its share of the uniform half
    greedy_share = (epsilon_greedy(q_values, 0.5) == 1).double().mean().item()
    assert greedy_share == pytest.approx(0.5 + 0.5 / 4, abs=0.04)


def test_td_loss_hand_computed_and_ignores_masked_entries():
    loss, stats = td_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0]), torch.ones(2), torch.tensor(2.0))
    assert loss.item() == pytest.approx((1.0 + 4.0) / 2)  # F.mse_loss's mean square, as CleanRL's PQN
    assert loss.item() == pytest.approx(F.mse_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0])).item())
    assert stats["q_values"].item() == pytest.approx(2.0)
    q_taken = torch.tensor([1.0, 50.0], requires_grad=True)
    masked, stats = td_loss(q_taken, torch.tensor([0.0, -9.0]), torch.tensor([1.0, 0.0]), torch.tensor(1.0))
    assert masked.item() == pytest.approx(1.0)  # only the first entry counts
    assert stats["q_values"].item() == pytest.approx(1.0)
    masked.backward()
    assert q_taken.grad.tolist() == pytest.approx([2.0, 0.0])  # no gradient through the masked entry


def test_masked_mean_divides_by_the_count_it_is_given_and_compute_gradients_passes_the_minibatch_count():
    """masked_mean is ppo_atari_envpool's: it divides by the count it is given (under torchrun, the count over every
    process). pqn_atari.py runs as one process, so compute_gradients passes the count of the minibatch's real
    transitions (at least 1: an all-reset minibatch has loss 0, not NaN)."""
    x, mask = torch.tensor([1.0, 2.0, 30.0]), torch.tensor([1.0, 1.0, 0.0])
    assert masked_mean(x, mask, torch.tensor(2.0)).item() == pytest.approx(1.5)
    assert masked_mean(x, mask, torch.tensor(4.0)).item() == pytest.approx(0.75)  # a share of a mean over 4 entries
    torch.manual_seed(0)
    q_network = pqn_atari.QNetwork(num_actions=3)
    obs = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)
    minibatch = {"obs": obs, "actions": torch.tensor([0, 1, 2, 1]), "targets": torch.tensor([0.5, -1.0, 2.0, 9.0])}
    minibatch["valid"] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    with torch.no_grad():
        q_taken = q_network(obs)[torch.arange(4), minibatch["actions"]]
    real = minibatch["valid"].bool()
    stats = compute_gradients(q_network, minibatch)
    assert stats["td_loss"].item() == pytest.approx((q_taken - minibatch["targets"])[real].square().mean().item())
    assert stats["q_values"].item() == pytest.approx(q_taken[real].mean().item())
    assert all(p.grad is not None for p in q_network.parameters())
    stats = compute_gradients(q_network, minibatch | {"valid": torch.zeros(4)})
    assert stats["td_loss"].item() == 0.0 and stats["q_values"].item() == 0.0


def test_q_network_layernorm_before_every_hidden_relu():
    network = pqn_atari.QNetwork(num_actions=6)
    layers = list(network.encoder)
    relus = [i for i, layer in enumerate(layers) if isinstance(layer, torch.nn.ReLU)]
    assert len(relus) == 4 and all(isinstance(layers[i - 1], torch.nn.LayerNorm) for i in relus)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    assert network.features(obs).shape == (3, 512)
    assert network(obs).shape == (3, 6)
    # with tau = inf every neuron is dormant: 100 only if the hidden activations reach the metric
    assert pqn_atari.measure_q_network(network, obs, float("inf"))["dormant_pct"] == 100.0


def test_layernorm_chw_on_an_nhwc_activation_equals_layernorm_on_nchw():
    """LayerNormCHW reads a channels-last activation as (H, W, C) with permuted weights: same output and gradients
    as nn.LayerNorm over (C, H, W) of the NCHW tensor, and the same state dict."""
    torch.manual_seed(0)
    reference, channels_last = torch.nn.LayerNorm([3, 4, 5]), pqn_atari.LayerNormCHW([3, 4, 5])
    torch.nn.init.normal_(reference.weight), torch.nn.init.normal_(reference.bias)
    channels_last.load_state_dict(reference.state_dict())
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    x_nhwc = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    expected, result = reference(x), channels_last(x_nhwc)
    assert result.is_contiguous(memory_format=torch.channels_last) and torch.allclose(result, expected, atol=1e-6)
    (expected * torch.arange(120.0).view(2, 3, 4, 5)).sum().backward()
    (result * torch.arange(120.0).view(2, 3, 4, 5)).sum().backward()
    assert torch.allclose(x_nhwc.grad, x.grad, atol=1e-5)
    assert torch.allclose(channels_last.weight.grad, reference.weight.grad, atol=1e-5)


# --------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------


def test_the_targets_bootstrap_from_max_q_of_the_next_observation(monkeypatch, tmp_path, tiny_ppo_flags):
    """main() feeds compute_q_lambda_targets max_a Q(s_{t+1}, a) at row t: the max Q of the next step's acting pass
    (the last row: of the observation after the rollout), not row t's own."""
    acted, fed = [], []
    greedy, targets = pqn_atari.epsilon_greedy, pqn_atari.compute_q_lambda_targets
    monkeypatch.setattr(pqn_atari, "epsilon_greedy", lambda q, e: acted.append(q.max(dim=-1).values.clone()) or greedy(q, e))
    monkeypatch.setattr(pqn_atari, "compute_q_lambda_targets", lambda *args: fed.append(args[1].clone()) or targets(*args))
    run_main(monkeypatch, pqn_atari, [*tiny_ppo_flags, "--total-timesteps", "64", "--runs-dir", str(tmp_path)])
    assert len(fed) == 2 and len(acted) == 32  # 2 iterations of 16 steps
    for iteration, next_max_q in enumerate(fed):
        assert torch.equal(next_max_q[:-1], torch.stack(acted[16 * iteration + 1 : 16 * (iteration + 1)]))


def test_tiny_run_writes_every_tag_and_artifact(tmp_path, tiny_ppo_flags):
    artifacts = ["--save-model", "--save-embeddings", "--embeddings-per-iteration", "10", "--capture-video"]
    flags = [*tiny_ppo_flags, "--runs-dir", str(tmp_path), "--checkpoint-interval", "3", "--exploration-fraction", "0.5"]
    track, env = fake_wandb(tmp_path)
    result = run_script(SCRIPT, *flags, *artifacts, *track, env=env)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert os.path.basename(run_dir).startswith("Breakout-v5__pqn_atari__1__")

    scalars = read_scalars(run_dir)
    assert PQN_TAGS <= set(scalars), PQN_TAGS - set(scalars)
    # 256 steps / 32 per iteration = 8 iterations, metrics on 2, 4, 6, 8
    assert [step for step, _ in scalars["charts/SPS"]] == [32 * i for i in range(1, 9)]
    assert [step for step, _ in scalars["metrics/feature_rank"]] == [64, 128, 192, 256]
    for tag in PQN_TAGS:
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag
    assert all(1 <= value <= 24 for _, value in scalars["metrics/feature_rank"])  # at most the metrics batch
    assert all(0 <= value <= 100 for _, value in scalars["metrics/dormant_pct"])
    # epsilon of each iteration's last step: decays over the first 128 steps, then stays at 0.01
    epsilons = [value for _, value in scalars["charts/epsilon"]]
    assert epsilons[0] == pytest.approx(1.0 - 0.99 * 30 / 128)
    assert epsilons == sorted(epsilons, reverse=True) and epsilons[-4:] == pytest.approx([0.01] * 4)
    returns = [value for _, value in scalars["charts/episodic_return"]]
    assert all(value >= 0 for value in returns) and len(returns) >= 2  # Breakout scores are never negative

    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["batch_size"] == 32 and args["phases"] == [[0, 2, 16, 16]] and args["num_iterations"] == 8
    assert args["q_lambda"] == 0.65 and args["adam_eps"] == 1e-8 and args["max_grad_norm"] == 10.0

    expected = dict(iterations=8, global_step=256, metric_iterations=[2, 4, 6, 8], embedding_rows=40, tracked="fake")
    check_run_artifacts(run_dir, "pqn_atari", **expected)


def test_seeded_runs_are_reproducible_and_a_schedule_changes_the_pool_at_each_phase(monkeypatch, tmp_path, tiny_ppo_flags):
    """Two seeded runs in one process: what the first leaves behind (torch's RNG, EnvPool) must not change the second."""
    logged = []
    flags = [*with_schedule(tiny_ppo_flags, "0:2x16,0.5:4x8"), "--seed", "3", "--lr-scaling", "linear"]
    for name in ("a", "b"):
        run_main(monkeypatch, pqn_atari, [*flags, "--runs-dir", str(tmp_path / name)])
        logged.append(read_scalars(only_run_dir(tmp_path / name)))
    for tag in ("losses/td_loss", "losses/q_values", "metrics/grad_kurtosis", "metrics/q_mean"):
        assert logged[0][tag] == logged[1][tag], tag
    scalars = logged[0]
    # 4 iterations of 2 x 16 up to step 128, then 4 of 4 x 8: each tag logged at the end of its iteration
    assert scalars["charts/num_envs"] == [(32 * i, 2 if i <= 4 else 4) for i in range(1, 9)]
    assert scalars["charts/num_steps"] == [(32 * i, 16 if i <= 4 else 8) for i in range(1, 9)]
    assert scalars["charts/batch_size"] == [(32 * i, 32) for i in range(1, 9)]
    # the LR of each phase's N_envs (k = N_envs / 8), annealed from the step the iteration starts at
    expected = [2.5e-4 * (2 if i <= 4 else 4) / 8 * (1 - 32 * (i - 1) / 256) for i in range(1, 9)]
    assert [value for _, value in scalars["charts/learning_rate"]] == pytest.approx(expected)
    assert json.load(open(os.path.join(only_run_dir(tmp_path / "a"), "done.json"))) == {"global_step": 256, "iterations": 8}


def test_compiled_path_logs_the_losses_of_the_default_path(monkeypatch, tmp_path, tiny_ppo_flags):
    """--compile (torch.compile of acting and of the update) changes how the same maths runs, not what is learned:
    on a fixed seed the losses agree up to float rounding (--no-channels-last: in the PPO and Procgen tests). Traced
    and differentiated by aot_eager, as every script's (conftest.check_same_losses): inductor's code cost about 15 s of the
    suite here on a cold cache (with inductor, the TD losses of about 1e-3 differed by up to 4e-6 by the third
    iteration on some CPUs: 1e-5 absolute still tells a different update from rounding)."""
    flags = [*tiny_ppo_flags, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/td_loss", "losses/q_values")
    variants = {"compiled": ["--compile"]}
    check_same_losses(monkeypatch, tmp_path, pqn_atari, flags, variants, tags, compile_backend="aot_eager", abs_tolerance=1e-5)


def test_bf16_logs_the_losses_of_fp32_within_measured_tolerances_and_resumes_either_way(monkeypatch, tmp_path, tiny_ppo_flags):
    """The encoder in bfloat16, its LayerNorms included; the Q head and the Q(lambda) targets in float32."""
    network = pqn_atari.QNetwork(4, bf16=True)
    with pqn_atari.metrics.hidden_activations(network) as activations:
        q_values = network(torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8))
    assert {a.dtype for a in activations} == {torch.bfloat16} and q_values.dtype == torch.float32
    flags = [*tiny_ppo_flags, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    check_bf16(monkeypatch, tmp_path, pqn_atari, flags, ("losses/td_loss", "losses/q_values"))


def test_sigterm_checkpoints_and_resume_reaches_the_same_total(tmp_path, tiny_ppo_flags):
    flags = [*with_schedule(tiny_ppo_flags, "0:2x16,0.5:4x8"), "--runs-dir", str(tmp_path)]  # 32 steps an iteration
    flags[flags.index("--total-timesteps") + 1] = "320"  # 10 iterations: long enough to interrupt
    interrupt_with_sigterm(SCRIPT, flags)
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    interrupted_at = checkpoint["iteration"]
    assert 1 <= interrupted_at < 10 and checkpoint["global_step"] == 32 * interrupted_at

    result = run_script(SCRIPT, "--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda")
    assert result.returncode == 0, result.stderr
    assert only_run_dir(tmp_path) == run_dir  # same run directory
    final = torch.load(checkpoint_path, weights_only=True)
    assert_optimizer_went_on(final)
    assert final["iteration"] == 10 and final["global_step"] == 320
    scalars = read_scalars(run_dir)
    steps = [step for step, _ in scalars["charts/SPS"]]
    assert steps == [32 * i for i in range(1, 11)]  # every iteration logged exactly once, up to the total
    assert [step for step, _ in scalars["losses/td_loss"]] == steps
    assert scalars["charts/num_envs"] == [(step, 2 if step <= 160 else 4) for step in steps]  # resumed in its phase


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
    (["--learning-rate", "-0.1"], "--learning-rate must be finite and > 0"),
    (["--max-grad-norm", "0"], "--max-grad-norm must be finite and > 0"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--q-lambda", "-0.1"], "--q-lambda must be in [0, 1]"),
    (["--start-e", "2"], "--start-e must be in [0, 1]"),
    (["--end-e", "-0.01"], "--end-e must be in [0, 1]"),
    (["--exploration-fraction", "1.5"], "--exploration-fraction must be in [0, 1]"),
    (["--metrics-interval", "-1"], "--metrics-interval must be finite and >= 0"),
    (["--dormant-threshold", "-1"], "--dormant-threshold must be finite and >= 0"),
    (["--max-episode-steps", "0"], "--max-episode-steps must be finite and > 0"),
    (["--resume", "/no/such/checkpoint.pt"], "no such checkpoint file"),
    (["--runs-dir", "/proc/forbidden"], "--runs-dir"),
    (["--torch-threads", "0"], "--torch-threads must be finite and > 0, got 0"),
    (["--seed", "-1"], "--seed -1, "),  # the env seeds are C ints: EnvPool's traceback once the run was made
    (["--seed", "2147483647"], "iterations: env seeds ("),
    (["--torch-threads", "2147483648"], "--torch-threads must be below 2**31"),
    (["--torch-threads", str((os.cpu_count() or 1) + 1)], "CPUs here"),  # 100,000 threads: a segfault
    (["--cudagraphs"], "--cudagraphs needs --compile and CUDA"),
    (["--save-embeddings", "--metrics-interval", "0"], "--save-embeddings needs --metrics-interval > 0"),
    (["--compile", "--cudagraphs", "--no-cuda"], "--cudagraphs needs --compile and CUDA"),
    (["--schedule", "0:2x16,0.5:4x8,0.3:2x8"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0.1:2x16"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0:8by128"], ": write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
    (["--schedule", "0:8x128,0.5:3x3"], "--num-minibatches 4 does not divide the batch of --schedule phase 0.5:3x3"),
]


@pytest.mark.parametrize("flags, fragment", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(pqn_atari.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags])
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")  # nothing was created


@pytest.mark.parametrize("flags", [["--num-envs", "eight"], ["--lr-scaling", "cubic"], ["--no-such-flag", "1"]])
def test_flags_tyro_rejects_exit_2_naming_the_flag(tmp_path, monkeypatch, capsys, flags):
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags]
    assert flags[0] in tyro_error(pqn_atari.main, monkeypatch, capsys, argv)
    assert not os.path.exists(tmp_path / "runs")


def test_resume_rejects_a_file_that_is_not_a_pqn_checkpoint(tmp_path, monkeypatch, capsys):
    model_only = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(2)}, model_only)
    ppo_checkpoint = tmp_path / "ppo_checkpoint.pt"  # another script's flags (gae_lambda) do not fit Args
    torch.save({"args": {"gae_lambda": 0.95}, "model": {}, "optimizer": {}, "iteration": 1, "rng": {}}, ppo_checkpoint)
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    not_ours = "is not a checkpoint.pt of pqn_atari.py"
    for path, fragment in ((model_only, not_ours), (ppo_checkpoint, not_ours), (tmp_path / "junk.pt", "not a readable")):
        assert fragment in usage_error(pqn_atari.main, monkeypatch, capsys, [SCRIPT, "--resume", str(path)])


def test_a_bad_flag_from_the_shell(tmp_path):
    """The real command line: one line, exit 2 (tyro's refusals and the other checks: in-process, above)."""
    flags = ["--q-lambda", "2"]
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and flags[0] in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
    assert "--q-lambda must be in [0, 1], got 2" in result.stderr


def test_minibatch_size_and_lr_scaling_derive_the_rest():
    derive = lambda **flags: pqn_atari.validate_and_derive(pqn_atari.Args(runs_dir="/tmp", **flags))  # noqa: E731
    args = derive(num_envs=32, num_steps=16, minibatch_size=64, lr_scaling="sqrt", anneal_lr=False)
    assert args.batch_size == 512 and pqn_atari.phase_at(args, 0) == pqn_atari.Phase(32, 16, 64)
    assert pqn_atari.phase_at(args, 0).batch_size == 512
    assert pqn_atari.learning_rate(args, 32, 5000) == pytest.approx(2.5e-4 * 2)  # k = 32 / 8 = 4
    args = derive(num_envs=16, lr_scaling="linear")
    assert pqn_atari.phase_at(args, 0) == (16, 128, 2048 // 4)
    assert args.num_iterations == 10_000_000 // 2048 and args.planned_steps == args.num_iterations * 2048
    assert pqn_atari.learning_rate(args, 16, 0) == pytest.approx(5e-4)
    assert pqn_atari.learning_rate(args, 16, args.planned_steps // 2) == pytest.approx(2.5e-4)  # annealed
    assert pqn_atari.learning_rate(derive(num_envs=16, lr_scaling="inverse"), 16, 0) == pytest.approx(1.25e-4)
    args = derive(total_timesteps=1000, schedule="0:2x16,0.5:4x16")  # 16 batches of 32 to step 512, then 7 of 64
    assert args.phases == [(0, 2, 16, 8), (500, 4, 16, 16)] and args.num_iterations == 23 and args.planned_steps == 960


def test_a_checkpoint_holds_the_loop_state_and_restores_the_modules(tmp_path, capsys):
    """save_checkpoint and restore_checkpoint are ppo_atari_envpool's: the loop's counters come as a `loop_state` dict
    (PQN adapts no value during training, so it holds the iteration and the global step only)."""
    layer = torch.nn.Linear(2, 2)
    pqn_atari.save_checkpoint(str(tmp_path), pqn_atari.Args(), {"iteration": 3, "global_step": 96}, [], model=layer)
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert checkpoint["iteration"] == 3 and checkpoint["global_step"] == 96 and checkpoint["args"]["q_lambda"] == 0.65
    restored = torch.nn.Linear(2, 2)
    assert pqn_atari.restore_checkpoint(checkpoint, model=restored) == 96
    assert torch.equal(restored.weight, layer.weight) and "resumed at iteration 4 (global step 96)" in capsys.readouterr().out


def test_cleanrls_pqn_choices_are_the_defaults_and_adam_stays_reachable(tmp_path, monkeypatch):
    """CleanRL's pqn_atari_envpool.py (the PQN of the paper, footnote 2): RAdam with torch's eps 1e-8, a Q head
    initialised with orthogonal gain sqrt(2), F.mse_loss (tested above). --optimizer adam keeps the older runs' Adam."""
    torch.manual_seed(0)
    head = pqn_atari.QNetwork(num_actions=6).head.weight.detach().double()
    # an orthogonal (6, 512) matrix with gain g has orthonormal rows scaled by g: W W^T = g^2 I
    torch.testing.assert_close(head @ head.T, 2.0 * torch.eye(6, dtype=torch.float64), atol=1e-5, rtol=0)
    made = []
    for name in ("RAdam", "Adam"):  # record which optimizer main() makes, with which epsilon
        real = getattr(torch.optim, name)
        monkeypatch.setattr(
            torch.optim, name, lambda *a, real=real, **kw: made.append((real.__name__, kw["eps"])) or real(*a, **kw)
        )
    tiny = ["--no-cuda", "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "32", "--metrics-interval", "0"]
    for flags in ([], ["--optimizer", "adam"]):
        monkeypatch.setattr(sys, "argv", ["pqn_atari.py", *tiny, "--runs-dir", str(tmp_path / str(len(made))), *flags])
        pqn_atari.main()
    assert made == [("RAdam", 1e-8), ("Adam", 1e-8)]


def test_q_mean_is_the_mean_over_the_states_of_the_greedy_value():
    q_network = pqn_atari.QNetwork(2)
    with torch.no_grad():
        q_network.head.weight.zero_()
        q_network.head.bias.copy_(torch.tensor([1.0, 3.0]))  # Q(s, .) = (1, 3) in every state
    measured = pqn_atari.measure_q_network(q_network, torch.zeros(4, 4, 84, 84, dtype=torch.uint8), 0.025)
    assert measured["q_mean"] == 3.0  # the max over the actions, then the mean over the states (not 2, over all)


def test_a_life_lost_on_the_time_limit_is_a_termination(monkeypatch, tmp_path, tiny_ppo_flags):
    check_life_lost_on_the_time_limit(monkeypatch, tmp_path, pqn_atari, tiny_ppo_flags, "compute_q_lambda_targets")
