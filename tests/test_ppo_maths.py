"""The loop's maths on hand-made tensors, and EnvPool's reset step on a real tiny episode."""

import math

import envpool
import numpy as np
import pytest
import torch

from ppo_atari_envpool import compute_gae, ppo_loss, reset_step_mask


def gae(rewards, values, terminations, truncations, valid, next_value, gamma=0.5, lam=0.5):
    column = lambda xs: torch.tensor(xs, dtype=torch.float32)[:, None]  # noqa: E731 - (T, N=1)
    return compute_gae(column(rewards), column(values), column(terminations), column(truncations), column(valid),
                       torch.tensor([next_value]), gamma, lam)  # fmt: skip


def test_gae_termination_and_reset_step():
    # t=1 ends the episode (terminal), t=2 is EnvPool's reset step, t=3 a new episode.
    advantages, returns = gae(rewards=[1, 2, 0, 3], values=[0.5, 1.0, 4.0, 2.0], terminations=[0, 1, 0, 0],
                              truncations=[0, 0, 0, 0], valid=[1, 1, 0, 1], next_value=1.0)  # fmt: skip
    # t=3: 3 + 0.5*1 - 2 = 1.5; t=2: masked; t=1: 2 + 0 - 1 = 1 (no bootstrap, chain cut);
    # t=0: (1 + 0.5*1 - 0.5) + 0.5*0.5*1 = 1.25
    assert advantages[:, 0].tolist() == pytest.approx([1.25, 1.0, 0.0, 1.5])
    assert returns[:, 0].tolist() == pytest.approx([1.75, 2.0, 4.0, 3.5])


def test_gae_truncation_bootstraps_from_last_observation():
    # Same rollout but t=1 is a time-limit truncation: values[2] = V(last observation) = 4
    advantages, _ = gae(rewards=[1, 2, 0, 3], values=[0.5, 1.0, 4.0, 2.0], terminations=[0, 0, 0, 0],
                        truncations=[0, 1, 0, 0], valid=[1, 1, 0, 1], next_value=1.0)  # fmt: skip
    # t=1: 2 + 0.5*4 - 1 = 3 (chain still cut); t=0: 1 + 0.25*3 = 1.75
    assert advantages[:, 0].tolist() == pytest.approx([1.75, 3.0, 0.0, 1.5])


def test_gae_without_episode_end_is_plain_gae():
    advantages, _ = gae(rewards=[1, 1], values=[0, 0], terminations=[0, 0], truncations=[0, 0], valid=[1, 1],
                        next_value=2.0)  # fmt: skip
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


def loss_args(**overrides):
    base = dict(new_logprob=torch.zeros(2), old_logprob=torch.zeros(2), advantages=torch.tensor([1.0, -2.0]),
                new_value=torch.tensor([1.0, 2.0]), old_value=torch.tensor([1.0, 2.0]), returns=torch.zeros(2),
                entropy=torch.tensor([0.5, 1.5]), mask=torch.ones(2), clip_coef=0.2, clip_vloss=False,
                ent_coef=0.01, vf_coef=0.5, norm_adv=False)  # fmt: skip
    return {**base, **overrides}


def test_ppo_loss_hand_computed():
    loss, stats = ppo_loss(**loss_args())
    # ratio 1: policy loss -mean(A) = 0.5; value 0.5 * mean(1, 4) = 1.25; entropy mean 1
    assert stats["policy_loss"].item() == pytest.approx(0.5)
    assert stats["value_loss"].item() == pytest.approx(1.25)
    assert stats["entropy"].item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(0.5 - 0.01 * 1.0 + 0.5 * 1.25)


def test_ppo_loss_clips_the_ratio():
    up = torch.full((1,), math.log(1.5))
    _, positive = ppo_loss(**loss_args(new_logprob=up, old_logprob=torch.zeros(1), advantages=torch.ones(1),
                                       new_value=torch.zeros(1), old_value=torch.zeros(1), returns=torch.zeros(1),
                                       entropy=torch.zeros(1), mask=torch.ones(1)))  # fmt: skip
    assert positive["policy_loss"].item() == pytest.approx(-1.2)  # gain capped at 1 + eps
    assert positive["clipfrac"].item() == 1.0
    _, negative = ppo_loss(**loss_args(new_logprob=up, old_logprob=torch.zeros(1), advantages=-torch.ones(1),
                                       new_value=torch.zeros(1), old_value=torch.zeros(1), returns=torch.zeros(1),
                                       entropy=torch.zeros(1), mask=torch.ones(1)))  # fmt: skip
    assert negative["policy_loss"].item() == pytest.approx(1.5)  # pessimistic: unclipped loss kept


def test_ppo_loss_ignores_masked_entries():
    valid = ppo_loss(**loss_args(new_logprob=torch.zeros(1), old_logprob=torch.zeros(1), advantages=torch.tensor([1.0]),
                                 new_value=torch.tensor([1.0]), old_value=torch.tensor([0.5]), returns=torch.zeros(1),
                                 entropy=torch.tensor([0.5]), mask=torch.ones(1), clip_vloss=True,
                                 norm_adv=True))[0]  # fmt: skip
    garbage = ppo_loss(**loss_args(new_logprob=torch.tensor([0.0, 3.0]), old_logprob=torch.tensor([0.0, -3.0]),
                                   advantages=torch.tensor([1.0, 100.0]), new_value=torch.tensor([1.0, 50.0]),
                                   old_value=torch.tensor([0.5, -50.0]), returns=torch.tensor([0.0, 9.0]),
                                   entropy=torch.tensor([0.5, 7.0]), mask=torch.tensor([1.0, 0.0]), clip_vloss=True,
                                   norm_adv=True))[0]  # fmt: skip
    assert garbage.item() == pytest.approx(valid.item())


def test_clipped_value_loss_is_pessimistic():
    _, stats = ppo_loss(**loss_args(new_value=torch.tensor([1.0, 2.0]), old_value=torch.tensor([0.0, 2.0]),
                                    clip_vloss=True))  # fmt: skip
    # entry 1: unclipped (1-0)^2 = 1, clipped (0.2-0)^2 = 0.04 -> max 1; entry 2: 4 -> 0.5 * mean(1, 4)
    assert stats["value_loss"].item() == pytest.approx(1.25)
    _, stats = ppo_loss(**loss_args(new_value=torch.tensor([1.0, 2.0]), old_value=torch.tensor([3.0, 2.0]),
                                    returns=torch.tensor([3.0, 2.0]), clip_vloss=True))  # fmt: skip
    # entry 1: unclipped (1-3)^2 = 4, clipped (2.8-3)^2 = 0.04 -> 4; entry 2: 0 -> 0.5 * mean(4, 0) = 1
    assert stats["value_loss"].item() == pytest.approx(1.0)
