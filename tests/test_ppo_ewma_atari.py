"""ppo_ewma_atari.py: the decoupled loss, the EWMA proximal weights, and end to end."""

import copy
import json
import math
import os
from dataclasses import asdict

import pytest
import torch
from conftest import (
    PPO_TAGS,
    TINY_PPO_FLAGS,
    assert_optimizer_went_on,
    check_bf16,
    check_life_lost_on_the_time_limit,
    check_run_artifacts,
    check_same_losses,
    fake_wandb,
    interrupt_with_sigterm,
    only_run_dir,
    read_scalars,
    refused_over_two_processes,
    run_main,
    run_script,
    run_torchrun,
    run_twice,
    tyro_error,
    usage_error,
    with_schedule,
)
from torch import nn

import ppo_atari_envpool
import ppo_ewma_atari
from ppo_atari_envpool import Args as PPOArgs
from ppo_atari_envpool import ppo_loss
from ppo_ewma_atari import Phase, adapted_step_size, ewma_update, ppo_ewma_loss

SCRIPT = "ppo_ewma_atari.py"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm_adv", [True, False])
def test_loss_with_proximal_equal_to_behaviour_is_ppo_loss(seed, norm_adv):
    generator = torch.Generator().manual_seed(seed)
    draw = lambda: torch.randn(64, generator=generator)  # noqa: E731
    new_logprob, new_value, entropy = draw() * 0.3 - 1, draw(), draw().abs()
    minibatch = {"logprobs": draw() * 0.3 - 1, "advantages": draw(), "values": draw(), "returns": draw()}
    minibatch["valid"] = (torch.rand(64, generator=generator) > 0.1).float()
    statistics = ppo_ewma_atari.minibatch_statistics(minibatch)
    coefficients = dict(clip_coef=0.1, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=norm_adv)
    ppo, ppo_stats = ppo_loss(new_logprob, new_value, entropy, minibatch, statistics, **coefficients)
    minibatch["proximal_logprobs"] = minibatch["logprobs"]
    ewma, ewma_stats = ppo_ewma_loss(new_logprob, new_value, entropy, minibatch, statistics, weight_cap=100.0, **coefficients)
    assert ewma.item() == ppo.item()  # exactly, not approximately
    for name in ppo_stats:
        assert ewma_stats[name].item() == pytest.approx(ppo_stats[name].item(), abs=1e-7), name


def test_importance_weight_is_capped_and_carries_no_gradient():
    new = torch.zeros(1, requires_grad=True)
    minibatch = {"logprobs": torch.full((1,), -10.0), "proximal_logprobs": torch.zeros(1), "advantages": torch.ones(1)}
    minibatch |= {"values": torch.zeros(1), "returns": torch.zeros(1), "valid": torch.ones(1)}
    statistics = ppo_ewma_atari.minibatch_statistics(minibatch)
    coefficients = dict(clip_coef=0.2, clip_vloss=False, ent_coef=0.0, vf_coef=0.0, norm_adv=False, weight_cap=100.0)
    loss, stats = ppo_ewma_loss(new, torch.zeros(1), torch.zeros(1), minibatch, statistics, **coefficients)
    # pi_prox / pi_behavior = e^10 ~ 22026 is capped at 100; r_prox = 1 -> loss = -100 * A
    assert loss.item() == pytest.approx(-100.0)
    # approx_kl is PPO's, from the behaviour policy (log ratio 10), not from the proximal one (0): e^10 - 1 - 10
    assert stats["approx_kl"].item() == pytest.approx(math.exp(10) - 11, rel=1e-5)
    loss.backward()
    assert new.grad.item() == pytest.approx(-100.0)  # d/dnew of -w * exp(new - prox) at r = 1


def test_gradients_with_the_proximal_network_equal_to_the_agent_are_ppos():
    """compute_gradients on a minibatch that the agent itself collected, with a proximal network equal to it:
    pi_prox = pi_behavior = pi_theta, so the statistics and the gradient are ppo_atari_envpool.compute_gradients'."""
    torch.manual_seed(0)
    agent = ppo_ewma_atari.Agent(4, False)
    ppo_agent = copy.deepcopy(agent)
    obs = torch.randint(0, 255, (6, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        actions, logprobs, _, values, _ = agent.get_action_and_value(obs)
    minibatch = {"obs": obs, "actions": actions, "logprobs": logprobs, "values": values, "returns": torch.randn(6)}
    minibatch |= {"advantages": torch.randn(6), "valid": torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])}
    statistics, clip_coef = ppo_ewma_atari.minibatch_statistics(minibatch), torch.tensor(0.1)
    proximal = copy.deepcopy(agent)
    stats = ppo_ewma_atari.compute_gradients(agent, proximal, minibatch, statistics, ppo_ewma_atari.Args(), clip_coef)
    ppo_stats = ppo_atari_envpool.compute_gradients(ppo_agent, minibatch, statistics, PPOArgs(), clip_coef)
    for name in ppo_stats:
        assert stats[name].item() == pytest.approx(ppo_stats[name].item(), abs=1e-6), name
    for parameter, ppo_parameter in zip(agent.parameters(), ppo_agent.parameters(), strict=True):
        assert torch.allclose(parameter.grad, ppo_parameter.grad, atol=1e-6)


def linear_model(value):
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def run_ewma(beta, trajectory):
    """Feed weights theta_1..theta_n (theta_0 = 0 is the initial weight) through ewma_update."""
    proximal, current, weight_sum = linear_model(0.0), linear_model(0.0), 1.0
    for theta in trajectory:
        with torch.no_grad():
            current.weight.fill_(theta)
        weight_sum = ewma_update(proximal, current, weight_sum, beta)
    return proximal.weight.item(), weight_sum


def test_ewma_with_com_zero_tracks_the_current_weights():
    assert run_ewma(0.0, [1.0, 5.0, -3.0])[0] == pytest.approx(-3.0)


def test_ewma_with_large_com_stays_near_the_old_weights():
    trajectory = [float(k) for k in range(1, 11)]
    slow, _ = run_ewma(1e6 / (1e6 + 1), trajectory)
    # beta ~ 1: the plain average of theta_0..theta_10 = 5, far behind the current 10
    assert slow == pytest.approx(5.0, abs=1e-3)


def test_ewma_is_the_bias_corrected_weighted_average():
    beta, trajectory = 0.5, [1.0, 4.0, 2.0, 8.0]
    proximal, weight_sum = run_ewma(beta, trajectory)
    thetas = [0.0, *trajectory]
    weights = [beta ** (len(thetas) - 1 - i) for i in range(len(thetas))]
    assert weight_sum == pytest.approx(sum(weights))
    assert proximal == pytest.approx(sum(w * t for w, t in zip(weights, thetas, strict=True)) / sum(weights))
    # first step by hand: W = 0.5 * 1 + 1 = 1.5, theta_prox = 0 * (0.5 / 1.5) + 1 / 1.5
    assert run_ewma(beta, [1.0])[0] == pytest.approx(2 / 3)


def test_adapted_centre_of_mass_rises_when_the_ddr_is_under_the_target_and_stays_in_bounds():
    bounds = (0.5, 512.0)
    assert adapted_step_size(8.0, 250.0, 1000.0, 0.5, bounds, sign=-1) == pytest.approx(16.0)  # (1/4) ** -0.5 = 2
    assert adapted_step_size(8.0, 4000.0, 1000.0, 0.5, bounds, sign=-1) == pytest.approx(4.0)
    assert adapted_step_size(400.0, 1.0, 1000.0, 1.0, bounds, sign=-1) == 512.0
    assert adapted_step_size(1.0, 1e6, 1000.0, 1.0, bounds, sign=-1) == 0.5
    assert adapted_step_size(0.2, 250.0, 1000.0, 0.5, (0.01, 0.5)) == pytest.approx(0.1)  # sign +1: the epsilon shrinks


@pytest.fixture(scope="module")
def seeded_runs(tmp_path_factory):
    """Two tiny runs with --ewma-com 4, the first also with every artifact flag (which add files, not randomness): the
    tiny-run test reads the first, the reproducibility test compares both."""
    artifacts = ["--checkpoint-interval", "4", "--save-model", "--save-embeddings", "--capture-video"]
    artifacts += ["--embeddings-per-iteration", "10"]
    runs_dir = tmp_path_factory.mktemp("seeded")
    track, env = fake_wandb(runs_dir / "first")
    return run_twice(SCRIPT, runs_dir, [*TINY_PPO_FLAGS, "--ewma-com", "4"], [*artifacts, *track], first_env=env)


def test_tiny_run_writes_every_tag_and_artifact(seeded_runs):
    _, run_dir = seeded_runs[0]
    scalars = read_scalars(run_dir)
    expected = PPO_TAGS | {"metrics/kl_prox"}
    assert expected <= set(scalars), expected - set(scalars)
    # The proximal policy, an EWMA of past weights, lags the updated one: KL > 0 (categorical_kl clamps at 0, so >= 0
    # could not fail). It is 0 if the proximal network tracked the agent or kl_prox compared the agent with itself.
    assert [step for step, _ in scalars["metrics/kl_prox"]] == [64, 128, 192, 256]
    assert all(value > 0 for _, value in scalars["metrics/kl_prox"])
    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["batch_size"] == 32 and args["phases"] == [[0, 2, 16, 16]] and args["planned_steps"] == 256
    expected = dict(iterations=8, global_step=256, metric_iterations=[2, 4, 6, 8], embedding_rows=40, tracked="fake")
    checkpoint = check_run_artifacts(run_dir, "ppo_ewma_atari", **expected)
    assert checkpoint["ewma_weight_sum"] > 1.0 and (checkpoint["ewma_com"], checkpoint["clip_coef"]) == (4.0, 0.1)
    assert set(checkpoint["proximal"]) == set(checkpoint["model"])


def test_seeded_runs_are_reproducible(seeded_runs):
    logged = [read_scalars(run_dir) for _, run_dir in seeded_runs]
    for tag in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl", "metrics/grad_kurtosis", "metrics/kl_prox"):
        assert logged[0][tag] == logged[1][tag], tag


def test_schedule_phases_and_ddr_target_by_step():
    schedule = dict(schedule="0:8x128,0.5:32x32,0.8:128x16", minibatch_size=256, total_timesteps=10_240)
    args = ppo_ewma_atari.validate_and_derive(ppo_ewma_atari.Args(**schedule, target_ddr=100.0, target_ddr_final=10_000.0))
    assert args.phases == [(0, 8, 128, 256), (5120, 32, 32, 256), (8192, 128, 16, 256)]
    assert ppo_ewma_atari.phase_at(args, 8192) == Phase(128, 16, 256)  # a fixed minibatch size stays
    assert (args.num_iterations, args.planned_steps, args.num_envs, args.num_steps) == (9, 10_240, 8, 128)
    assert ppo_ewma_atari.learning_rate(args, 8, 5120) == pytest.approx(2.5e-4 / 2)  # annealed over the planned steps
    assert ppo_ewma_atari.target_ddr(args, 5120) == pytest.approx(1000.0)  # geometric: halfway, a factor of 10


def ewma_weight_sum(coms: list[float], steps_per_iteration: int = 4) -> float:
    """W after the iterations that used these centres of mass: W' = beta W + 1 per optimizer step, from W = 1."""
    weight_sum = 1.0
    for com in coms:
        for _ in range(steps_per_iteration):  # 2 epochs x 2 minibatches
            weight_sum = com / (com + 1) * weight_sum + 1
    return weight_sum


def test_sigterm_and_resume_keep_the_proximal_policy_and_the_adapted_centre_of_mass_across_phases(
    monkeypatch, tmp_path, tiny_ppo_flags
):
    """Two phases (2 x 16, then 4 x 8 from half of 500 steps) and a DDR target far under the tiny run's DDR: interrupted
    and resumed, the first update after the resume starts from the checkpoint's proximal weights, EWMA weight sum and
    centre of mass, every iteration logs its phase's sizes once, the centre of mass only falls, each value the last one
    adapted to its DDR, and the run ends at the 15 full batches that fit, step 480."""
    flags = [*with_schedule(tiny_ppo_flags, "0:2x16,0.5:4x8"), "--runs-dir", str(tmp_path)]
    flags += ["--target-ddr", "1000", "--adapt", "ewma-com"]
    flags[flags.index("--total-timesteps") + 1] = "500"
    interrupt_with_sigterm(SCRIPT, flags)
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    interrupted = torch.load(checkpoint_path, weights_only=True)
    assert 1 <= interrupted["iteration"] < 15 and interrupted["global_step"] == 32 * interrupted["iteration"]
    coms_before = [value for _, value in read_scalars(run_dir)["charts/ewma_com"]]
    assert len(coms_before) == interrupted["iteration"]
    assert interrupted["ewma_weight_sum"] == pytest.approx(ewma_weight_sum(coms_before), rel=1e-6)
    # The adapted centre of mass is loop state: the checkpoint carries the next iteration's, its args the flag as given.
    ddr_before = read_scalars(run_dir)["metrics/ddr"][-1][1]
    next_com = adapted_step_size(coms_before[-1], ddr_before, 1000, 0.1, (0.5, 512.0), sign=-1)
    assert interrupted["ewma_com"] == pytest.approx(next_com, rel=1e-6) and interrupted["args"]["ewma_com"] == 8.0

    # What the resumed run's first update starts from, recorded in-process. No logged value shows the proximal weights,
    # nor a reset of W: the centre of mass reaches its 0.5 bound within a few iterations here, where W' = W / 3 + 1
    # converges to 1.5 from any W (the final W check below holds after a reset too).
    first_update = {}

    def record_first_update(proximal, current, weight_sum, beta):
        if not first_update:  # before this call moves the proximal weights
            first_update.update(proximal={name: t.clone() for name, t in proximal.state_dict().items()}, beta=beta)
            first_update["weight_sum"] = weight_sum
        return ewma_update(proximal, current, weight_sum, beta)

    monkeypatch.setattr(ppo_ewma_atari, "ewma_update", record_first_update)
    run_main(monkeypatch, ppo_ewma_atari, ["--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda"])
    assert json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 480, "iterations": 15}
    assert_optimizer_went_on(torch.load(checkpoint_path, weights_only=True))
    # The saved proximal weights exactly: neither the agent's (which they lag, so a reset to them shows) nor a new
    # network's; and the saved W and centre of mass, not W = 1 or --ewma-com's 8.
    proximal, model = interrupted["proximal"], interrupted["model"]
    assert any(not torch.equal(proximal[name], model[name]) for name in model)
    assert first_update["proximal"].keys() == proximal.keys()
    assert all(torch.equal(first_update["proximal"][name], proximal[name]) for name in proximal)
    assert first_update["weight_sum"] == interrupted["ewma_weight_sum"] > 1.0
    assert first_update["beta"] == interrupted["ewma_com"] / (interrupted["ewma_com"] + 1) != 8 / 9
    scalars = read_scalars(run_dir)
    values = lambda tag: [value for _, value in scalars[tag]]  # noqa: E731
    steps = [32 * i for i in range(1, 16)]
    assert [step for step, _ in scalars["metrics/ddr"]] == [step for step, _ in scalars["charts/ewma_com"]] == steps
    assert values("charts/num_envs") == [2] * 8 + [4] * 7 and values("charts/num_steps") == [16] * 8 + [8] * 7
    assert values("charts/batch_size") == [32] * 15 and values("charts/clip_coef") == pytest.approx([0.1] * 15)
    assert values("charts/target_ddr") == [1000] * 15
    coms, ddrs = values("charts/ewma_com"), values("metrics/ddr")
    assert coms[0] == 8.0 and coms[-1] < 8.0 and coms == sorted(coms, reverse=True) and min(coms) >= 0.5
    for com, ddr, next_com in zip(coms[:-1], ddrs[:-1], coms[1:], strict=True):
        assert next_com == pytest.approx(adapted_step_size(com, ddr, 1000, 0.1, (0.5, 512.0), sign=-1), rel=1e-5)
    final = torch.load(checkpoint_path, weights_only=True)
    assert final["iteration"] == 15 and final["ewma_weight_sum"] == pytest.approx(ewma_weight_sum(coms), rel=1e-6)

    # A checkpoint of an older version (the adapted values in its args, no loop-state keys) resumes from its args' value.
    older_dir = tmp_path / "older" / "run"
    os.makedirs(older_dir)
    older = {key: value for key, value in interrupted.items() if key not in ("ewma_com", "clip_coef")}
    older["args"] = interrupted["args"] | {"ewma_com": 3.0, "total_timesteps": 32 * (interrupted["iteration"] + 1)}
    torch.save(older, older_dir / "checkpoint.pt")
    run_main(monkeypatch, ppo_ewma_atari, ["--resume", str(older_dir / "checkpoint.pt"), "--no-cuda"])  # one more iteration
    assert [value for _, value in read_scalars(str(older_dir))["charts/ewma_com"]] == [3.0]


def test_compiled_path_logs_the_losses_of_the_default_path(monkeypatch, tmp_path, tiny_ppo_flags):
    """--compile (torch.compile of acting and of the update) changes how the same maths runs, not what is learned:
    on a fixed seed the losses agree up to float rounding (--no-channels-last: in the PPO and Procgen tests). Traced
    and differentiated by aot_eager, as every script's (conftest.check_same_losses): inductor's code cost about 35 s
    of the suite on 2 cores on a cold cache."""
    flags = [*tiny_ppo_flags, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl")
    variants = {"compiled": ["--compile"]}
    check_same_losses(monkeypatch, tmp_path, ppo_ewma_atari, flags, variants, tags, compile_backend="aot_eager")


def test_bf16_logs_the_losses_of_fp32_within_measured_tolerances_and_resumes_either_way(monkeypatch, tmp_path, tiny_ppo_flags):
    flags = [*tiny_ppo_flags, "--total-timesteps", "96", "--torch-threads", "1"]  # 3 iterations
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl")
    check_bf16(monkeypatch, tmp_path, ppo_ewma_atari, flags, tags)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--ewma-com", "-1"], "--ewma-com must be finite and >= 0, got -1"),
        (["--importance-weight-cap", "0"], "--importance-weight-cap must be finite and > 0, got 0"),
        (["--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch"),
        (["--ewma-com-bounds", "5", "1"], "--ewma-com-bounds (5.0, 1.0) is not 0 < low <= high < inf"),
        (["--ewma-com-bounds", "1", "inf"], "--ewma-com-bounds (1.0, inf) is not 0 < low <= high < inf"),
        (["--ewma-com", "inf"], "--ewma-com must be finite and >= 0, got inf"),
        (["--schedule", "0.5:8x128"], "--schedule '0.5:8x128': write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0"),
        (["--resume", "/no/such.pt"], "no such checkpoint file"),
        (["--torch-threads", "0"], "--torch-threads must be finite and > 0, got 0"),
        (["--seed", "-1"], "--seed -1, "),  # the env seeds are C ints: EnvPool's traceback once the run was made
        (["--seed", "2147483647"], "iterations: env seeds ("),
        (["--torch-threads", "2147483648"], "--torch-threads must be below 2**31"),
        (["--torch-threads", str((os.cpu_count() or 1) + 1)], "CPUs here"),  # 100,000 threads: a segfault
        (["--cudagraphs"], "--cudagraphs needs --compile and CUDA"),
        (["--save-embeddings", "--metrics-interval", "0"], "--save-embeddings needs --metrics-interval > 0"),
        (["--adapt", "ewma-com"], "--target-ddr-final and --adapt ewma-com need --target-ddr"),
        (["--target-ddr-final", "9"], "--target-ddr-final and --adapt ewma-com need --target-ddr"),
        (["--compile", "--cudagraphs", "--no-cuda"], "--cudagraphs needs --compile and CUDA"),
    ],
)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(ppo_ewma_atari.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags])
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")  # nothing was created


@pytest.mark.parametrize("flags", [["--ewma-com", "big"], ["--lr-scaling", "cubic"], ["--no-such-flag", "1"]])
def test_flags_tyro_rejects_exit_2_naming_the_flag(tmp_path, monkeypatch, capsys, flags):
    argv = [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags]
    assert flags[0] in tyro_error(ppo_ewma_atari.main, monkeypatch, capsys, argv)
    assert not os.path.exists(tmp_path / "runs")


def test_resume_rejects_another_scripts_checkpoint(tmp_path, monkeypatch, capsys):
    ppo_checkpoint = tmp_path / "checkpoint.pt"  # right keys, but ppo_atari_envpool.py's flags (no --ewma-com)
    torch.save({"args": asdict(PPOArgs()), "model": {}, "optimizer": {}, "iteration": 1, "rng": {}}, ppo_checkpoint)
    line = usage_error(ppo_ewma_atari.main, monkeypatch, capsys, [SCRIPT, "--resume", str(ppo_checkpoint)])
    assert "is not a checkpoint.pt of ppo_ewma_atari.py" in line


def test_a_bad_flag_from_the_shell(tmp_path):
    """The real command line: one line, exit 2 (tyro's refusals and the other checks: in-process, above)."""
    flags = ["--ewma-com", "-2"]
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and flags[0] in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


# --------------------------------------------------------------------------------------
# One run over several processes (torchrun, Gloo on the CPU)
# --------------------------------------------------------------------------------------

TORCHRUN_FLAGS = "--no-cuda --num-envs 4 --num-steps 16 --num-minibatches 2 --update-epochs 2 --total-timesteps 512".split()
TORCHRUN_FLAGS += "--max-episode-steps 40 --metrics-interval 2 --metrics-batch 24 --target-kl 0.5".split()
EWMA_COEFFICIENTS = dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=True, weight_cap=1.5)


def reduction_worker(rank, init_file, leaves, data, out_path):
    """One of two processes: the PPO-EWMA loss of its rows, then the gradient sum of all_ranks_sum_gradients."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rows = (slice(0, 4), slice(4, 7))[rank]
    new_logprob, new_value, entropy = parameters = [leaf.clone().requires_grad_() for leaf in leaves]  # same weights
    minibatch = {name: values[rows] for name, values in data.items()}
    statistics = ppo_ewma_atari.minibatch_statistics(minibatch)  # over both processes
    loss, stats = ppo_ewma_loss(new_logprob[rows], new_value[rows], entropy[rows], minibatch, statistics, **EWMA_COEFFICIENTS)
    loss.backward()
    ppo_ewma_atari.all_ranks_sum_gradients(parameters)
    summed_stats = {name: ppo_ewma_atari.all_ranks_sum(value) for name, value in stats.items()}
    torch.save({"gradients": [p.grad for p in parameters], "stats": summed_stats}, f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def test_two_processes_with_different_reset_steps_get_exactly_the_single_process_gradient(tmp_path):
    """Rows 0-3 on process 0 (3 real transitions), rows 4-6 on process 1 (2): per-process means would weight
    them wrongly; the global-count shares summed over processes give the single-process loss and gradient."""
    generator = torch.Generator().manual_seed(0)
    data = {k: torch.randn(7, generator=generator) for k in ("values", "advantages", "returns")}
    data["logprobs"], data["proximal_logprobs"] = (torch.randn(7, generator=generator) * 0.3 - 1 for _ in range(2))
    data["valid"] = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    leaves = [torch.randn(7, generator=generator) * 0.3 - 1 for _ in range(3)]  # new log-prob, value, entropy
    whole = [leaf.clone().requires_grad_() for leaf in leaves]
    loss, stats = ppo_ewma_loss(*whole, data, ppo_ewma_atari.minibatch_statistics(data), **EWMA_COEFFICIENTS)
    loss.backward()
    torch.multiprocessing.spawn(reduction_worker, args=(tmp_path / "init", leaves, data, tmp_path / "out.pt"), nprocs=2)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"out.pt.{rank}", weights_only=True)
        for whole_parameter, gradient in zip(whole, result["gradients"], strict=True):
            assert torch.allclose(gradient, whole_parameter.grad, atol=1e-6)
        for name, value in stats.items():
            assert result["stats"][name].item() == pytest.approx(value.item(), abs=1e-6), name


def test_torchrun_sigterm_checkpoints_once_and_resume_counts_steps_like_one_process_with_identical_weights(tmp_path):
    flags = [*TORCHRUN_FLAGS, "--runs-dir", str(tmp_path), "--save-model"]
    flags[flags.index("--total-timesteps") + 1] = "640"  # 10 iterations
    stdout = interrupt_with_sigterm(SCRIPT, flags, nproc=2)
    assert stdout.count("continue with --resume") == 1  # process 0 alone saves and says so
    run_dir = only_run_dir(tmp_path)  # process 0 alone writes
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert 1 <= checkpoint["iteration"] < 10 and checkpoint["global_step"] == 64 * checkpoint["iteration"]
    assert set(checkpoint["proximal"]) == set(checkpoint["model"]) and checkpoint["ewma_weight_sum"] > 1.0
    result = run_torchrun(SCRIPT, 2, "--resume", os.path.join(run_dir, "checkpoint.pt"), "--no-cuda")
    assert result.returncode == 0, result.stderr
    assert "weights identical on 2 of 2 processes" in result.stdout  # the agent's and the proximal network's
    done = json.load(open(os.path.join(run_dir, "done.json")))
    assert done == {"global_step": 640, "iterations": 10}  # one process's count of these flags
    scalars = read_scalars(run_dir)
    expected = PPO_TAGS | {"metrics/kl_prox"}
    assert expected <= set(scalars), expected - set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [64 * i for i in range(1, 11)]
    # 4 envs, 40-step time limit, 160 steps each: at least 3 games per env, from both processes
    assert len(scalars["charts/episodic_length"]) >= 12
    assert json.load(open(os.path.join(run_dir, "args.json")))["num_envs"] == 4  # the global N_envs
    assert os.path.exists(os.path.join(run_dir, "ppo_ewma_atari.cleanrl_model"))  # --save-model kept on --resume


def test_flags_that_do_not_split_over_the_torchrun_processes_exit_2_with_one_line(monkeypatch, capsys):
    line = refused_over_two_processes(
        ppo_ewma_atari, monkeypatch, capsys, ppo_ewma_atari.Args(num_envs=3, num_steps=16, cuda=False)
    )
    assert line == "error: --num-envs 3 and the minibatch size 12 must split evenly over 2 processes"


def test_a_life_lost_on_the_time_limit_is_a_termination(monkeypatch, tmp_path, tiny_ppo_flags):
    check_life_lost_on_the_time_limit(monkeypatch, tmp_path, ppo_ewma_atari, tiny_ppo_flags)
