"""ppo_ewma_atari.py: the decoupled loss, the EWMA proximal weights, and end to end."""

import os

import pytest
import torch
from conftest import PPO_TAGS, interrupt_with_sigterm, only_run_dir, read_scalars, run_script, usage_error
from torch import nn

import ppo_ewma_atari
from ppo_atari_envpool import ppo_loss
from ppo_ewma_atari import ewma_update, ppo_ewma_loss

SCRIPT = "ppo_ewma_atari.py"


def random_minibatch(seed, size=64):
    generator = torch.Generator().manual_seed(seed)
    draw = lambda: torch.randn(size, generator=generator)  # noqa: E731
    mask = (torch.rand(size, generator=generator) > 0.1).float()
    return dict(new_logprob=draw() * 0.3 - 1, old_logprob=draw() * 0.3 - 1, advantages=draw(), new_value=draw(),
                old_value=draw(), returns=draw(), entropy=draw().abs(), mask=mask)  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm_adv", [True, False])
def test_loss_with_proximal_equal_to_behaviour_is_ppo_loss(seed, norm_adv):
    batch = random_minibatch(seed)
    coefficients = dict(clip_coef=0.1, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=norm_adv)
    ppo, ppo_stats = ppo_loss(**batch, **coefficients)
    old = batch.pop("old_logprob")
    ewma, ewma_stats = ppo_ewma_loss(**batch, proximal_logprob=old, behavior_logprob=old, **coefficients)
    assert ewma.item() == ppo.item()  # exactly, not approximately
    for name in ppo_stats:
        assert ewma_stats[name].item() == pytest.approx(ppo_stats[name].item(), abs=1e-7), name


def test_importance_weight_is_capped_and_carries_no_gradient():
    new = torch.zeros(1, requires_grad=True)
    loss, _ = ppo_ewma_loss(new, proximal_logprob=torch.zeros(1), behavior_logprob=torch.full((1,), -10.0),
                            advantages=torch.ones(1), new_value=torch.zeros(1), old_value=torch.zeros(1),
                            returns=torch.zeros(1), entropy=torch.zeros(1), mask=torch.ones(1), clip_coef=0.2,
                            clip_vloss=False, ent_coef=0.0, vf_coef=0.0, importance_weight_cap=100.0,
                            norm_adv=False)  # fmt: skip
    # pi_prox / pi_behavior = e^10 ~ 22026 is capped at 100; r_prox = 1 -> loss = -100 * A
    assert loss.item() == pytest.approx(-100.0)
    loss.backward()
    assert new.grad.item() == pytest.approx(-100.0)  # d/dnew of -w * exp(new - prox) at r = 1


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


def test_tiny_run_writes_every_tag(tmp_path, tiny_ppo_flags):
    result = run_script(
        SCRIPT, *tiny_ppo_flags, "--runs-dir", str(tmp_path), "--ewma-com", "4", "--checkpoint-interval", "4"
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    scalars = read_scalars(run_dir)
    expected = PPO_TAGS | {"metrics/kl_prox"}
    assert expected <= set(scalars), expected - set(scalars)
    assert all(value >= 0 for _, value in scalars["metrics/kl_prox"])
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert checkpoint["iteration"] == 8 and checkpoint["ewma_weight_sum"] > 1.0
    assert set(checkpoint["proximal"]) == set(checkpoint["model"])


def test_sigterm_and_resume_keep_the_proximal_policy(tmp_path, tiny_ppo_flags):
    flags = [*tiny_ppo_flags, "--runs-dir", str(tmp_path)]
    flags[flags.index("--total-timesteps") + 1] = "1280"
    interrupt_with_sigterm(SCRIPT, flags)
    checkpoint_path = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    interrupted = torch.load(checkpoint_path, weights_only=True)
    assert 1 <= interrupted["iteration"] < 40
    # 2 epochs x 2 minibatches = 4 EWMA steps per iteration with beta = 8/9 from W = 1
    steps = 4 * interrupted["iteration"]
    beta = 8 / 9
    assert interrupted["ewma_weight_sum"] == pytest.approx(sum(beta**k for k in range(steps + 1)), rel=1e-6)

    result = run_script(SCRIPT, "--resume", checkpoint_path, "--checkpoint-interval", "1000", "--no-cuda")
    assert result.returncode == 0, result.stderr
    final = torch.load(checkpoint_path, weights_only=True)
    assert final["iteration"] == 40 and final["global_step"] == 1280
    assert final["ewma_weight_sum"] == pytest.approx(sum(beta**k for k in range(4 * 40 + 1)), rel=1e-6)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--ewma-com", "-1"], "--ewma-com must be >= 0"),
        (["--importance-weight-cap", "0"], "--importance-weight-cap must be > 0"),
        (["--num-minibatches", "3"], "does not divide batch_size"),
        (["--resume", "/no/such.pt"], "no such checkpoint file"),
        (["--ewma-com", "big"], "--ewma-com"),
    ],
)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    line = usage_error(ppo_ewma_atari.main, monkeypatch, capsys, [SCRIPT, "--runs-dir", str(tmp_path / "runs"), *flags])
    assert fragment in line
    assert not os.path.exists(tmp_path / "runs")  # nothing was created


def test_bad_flag_from_the_shell(tmp_path):
    result = run_script(SCRIPT, "--runs-dir", str(tmp_path), "--ewma-com", "-2")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
