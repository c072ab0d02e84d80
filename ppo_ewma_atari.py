"""PPO-EWMA on Atari (EnvPool, gymnasium API) with the metrics of Mayor et al. (ICML 2025).

    python ppo_ewma_atari.py --env-id Breakout-v5 --ewma-com 8

PPO-EWMA (Hilton et al. 2022, "Batch size-invariance for policy optimization"; Beukman et
al. 2026 Sec. 2.2, eq. 4) decouples PPO's two uses of the behaviour policy: the behaviour
policy still corrects for off-policyness (importance weight pi_prox / pi_behavior), but the
clipping regularises towards a *proximal* policy, an exponentially weighted moving average
of the weights over optimizer steps whose centre of mass (`--ewma-com`) sets how old the
reference is, independently of how the data was collected. Everything else is
ppo_atari_envpool.py (same defaults, flags, tags and metrics), plus `metrics/kl_prox`.

From ppo_atari_envpool.py:
- EnvPool's reset step (the step after an episode ends returns the next episode's first
  observation and ignores the action) is masked out of the losses, advantages and metrics;
  time-limit truncations bootstrap from the value of the last observation.
- plasticity / optimisation metrics from `metrics.py` under `metrics/` every
  `--metrics-interval` iterations;
- `--separate-networks`, `--minibatch-size` and `--lr-scaling` for the study's sweeps;
- atomic checkpoints, SIGTERM/SIGINT checkpointing and `--resume`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import random
import re
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Literal

import numpy as np
import torch
import tyro
from torch import nn
from torch.distributions import Categorical

import metrics


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy, python and the environments)"""
    torch_deterministic: bool = True
    """set `torch.backends.cudnn.deterministic`"""
    cuda: bool = True
    """use CUDA when available (falls back to the CPU with a notice)"""
    track: bool = False
    """also log to Weights & Biases (TensorBoard is always written; WANDB_MODE=offline works)"""
    wandb_project_name: str = "parallel-data-collection"
    """the Weights & Biases project"""
    wandb_entity: str | None = None
    """the Weights & Biases entity (team)"""
    capture_video: bool = False
    """after training, record one evaluation episode of the final policy to runs/.../videos/"""
    runs_dir: str = "runs"
    """folder that holds the run directories"""
    save_model: bool = False
    """save the final model to runs/.../{exp_name}.cleanrl_model"""
    checkpoint_interval: int = 0
    """write runs/.../checkpoint.pt every this many iterations (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from (its run's flags are used)"""

    # Environment
    env_id: str = "Breakout-v5"
    """EnvPool Atari task id"""
    total_timesteps: int = 10_000_000
    """total environment steps (the paper uses 100M)"""
    max_episode_steps: int = 27_000
    """time limit in agent steps (27,000 = 108,000 frames, 30 minutes of play): the game is truncated there"""
    num_envs: int = 8
    """N_envs: parallel environments"""
    num_steps: int = 128
    """N_RO: rollout length per environment and iteration"""

    # Optimisation
    learning_rate: float = 2.5e-4
    """Adam learning rate (before --lr-scaling)"""
    lr_scaling: Literal["none", "sqrt", "linear", "inverse"] = "none"
    """multiply the LR by sqrt(k), k or 1/k with k = num_envs / lr_reference_envs (paper Fig. 11)"""
    lr_reference_envs: int = 8
    """num_envs at which --lr-scaling leaves the LR unchanged"""
    anneal_lr: bool = True
    """anneal the LR linearly to 0 over training"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    update_epochs: int = 4
    """epochs over each rollout"""
    num_minibatches: int = 4
    """minibatches per epoch (ignored when --minibatch-size is given)"""
    minibatch_size: int | None = None
    """fix the minibatch size instead; the number of minibatches is derived (Beukman et al. 2026)"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.1
    """PPO surrogate clipping epsilon"""
    clip_vloss: bool = True
    """clip the value loss around the old values"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm clipping"""
    target_kl: float | None = None
    """stop the epochs early when approx KL exceeds this"""
    separate_networks: bool = False
    """actor and critic get their own Nature-CNN encoder (paper Fig. 5)"""
    ewma_com: float = 8.0
    """centre of mass of the proximal-policy EWMA in optimizer steps; beta = com / (com + 1)"""
    importance_weight_cap: float = 100.0
    """cap on the importance weight pi_prox / pi_behavior (Hilton et al. 2022)"""

    # Metrics
    metrics_interval: int = 10
    """compute the metrics/ tags every this many iterations and on the last (0: never)"""
    metrics_batch: int = 2048
    """at most this many states of the rollout are used for the metrics"""
    dormant_tau: float = 0.025
    """dormant-neuron threshold tau (Sokar et al. 2023)"""
    save_embeddings: bool = False
    """on metrics iterations save penultimate features and values to runs/.../embeddings.npz"""
    embeddings_per_iteration: int = 256
    """states saved per metrics iteration with --save-embeddings"""

    # Derived after validation (not flags)
    batch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0
    scaled_learning_rate: tyro.conf.Suppress[float] = 0.0


# Flags that describe how to run, not what to learn: on --resume these come from the
# command line, every other flag from the checkpoint.
RUNTIME_FLAGS = ("cuda", "track", "wandb_project_name", "wandb_entity", "capture_video",
                 "save_model", "checkpoint_interval", "resume")  # fmt: skip


def fail(message: str) -> None:
    """Report a usage error on one line and exit with status 2 (as argparse does)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args() -> Args:
    """tyro parses the flags; its boxed error panels are folded into one line."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(Args)
    except SystemExit as exit_:
        if exit_.code in (0, None):
            sys.stderr.write(captured.getvalue())
            raise
        lines = [re.sub(r"[│╭╮╰╯─]|-{3,}", "", line).strip() for line in captured.getvalue().splitlines()]
        # Panel layout: title, message lines, a rule, help hints. Keep the message lines.
        body = [line for line in lines[1:] if line]
        message = " ".join(
            body[
                : next(
                    (i for i, line in enumerate(body) if line.startswith(("Argument helptext", "For full helptext"))),
                    len(body),
                )
            ]
        )
        fail(f"{message or 'invalid command line'} (see --help)")


def validate_and_derive(args: Args) -> Args:
    """Check every flag before any environment exists; fill in the derived values."""
    import envpool  # noqa: PLC0415 - imported here so --help stays fast

    for name in ("total_timesteps", "max_episode_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches", "lr_reference_envs",
                 "metrics_batch", "embeddings_per_iteration"):  # fmt: skip
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("checkpoint_interval", "metrics_interval", "ent_coef", "vf_coef", "dormant_tau", "ewma_com"):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("learning_rate", "adam_eps", "clip_coef", "max_grad_norm", "importance_weight_cap"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("gamma", "gae_lambda"):
        if not 0 <= getattr(args, name) <= 1:
            fail(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be > 0, got {args.target_kl}")
    try:
        is_atari = type(envpool.make_spec(args.env_id)).__name__ == "AtariEnvSpec"
    except Exception:  # noqa: BLE001 - unknown ids, and families whose runtime is missing (Procgen without Qt)
        is_atari = False
    if not is_atari:
        fail(f"--env-id {args.env_id!r} is not an EnvPool Atari task (e.g. Breakout-v5, Pong-v5, Qbert-v5)")

    args.batch_size = args.num_envs * args.num_steps
    if args.minibatch_size is not None:
        if args.minibatch_size <= 0 or args.minibatch_size > args.batch_size:
            fail(f"--minibatch-size must be in [1, batch_size={args.batch_size}], got {args.minibatch_size}")
        if args.batch_size % args.minibatch_size:
            fail(
                f"--minibatch-size {args.minibatch_size} does not divide batch_size = num_envs * num_steps = {args.batch_size}"
            )
        args.num_minibatches = args.batch_size // args.minibatch_size
    else:
        if args.num_minibatches > args.batch_size or args.batch_size % args.num_minibatches:
            fail(
                f"--num-minibatches {args.num_minibatches} does not divide batch_size = num_envs * num_steps = {args.batch_size}"
            )
        args.minibatch_size = args.batch_size // args.num_minibatches
    if args.total_timesteps < args.batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is smaller than one batch (num_envs * num_steps = {args.batch_size})"
        )
    args.num_iterations = args.total_timesteps // args.batch_size

    k = args.num_envs / args.lr_reference_envs
    lr_factor = {"none": 1.0, "sqrt": math.sqrt(k), "linear": k, "inverse": 1.0 / k}[args.lr_scaling]
    args.scaled_learning_rate = args.learning_rate * lr_factor

    try:
        os.makedirs(args.runs_dir, exist_ok=True)
    except OSError as error:
        fail(f"--runs-dir {args.runs_dir!r} cannot be created: {error.strerror}")
    if not os.access(args.runs_dir, os.W_OK):
        fail(f"--runs-dir {args.runs_dir!r} is not writable")
    return args


# --------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def nature_cnn() -> nn.Sequential:
    """Mnih et al. 2015 encoder: 3 convolutions (32, 64, 64) and a 512-unit dense layer."""
    return nn.Sequential(
        layer_init(nn.Conv2d(4, 32, 8, stride=4)),
        nn.ReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)),
        nn.ReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)),
        nn.ReLU(),
        nn.Flatten(),
        layer_init(nn.Linear(64 * 7 * 7, 512)),
        nn.ReLU(),
    )


def run_encoder(encoder: nn.Sequential, x: torch.Tensor, activations: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Apply the encoder; if a list is given, append every hidden post-ReLU output to it."""
    for layer in encoder:
        x = layer(x)
        if activations is not None and isinstance(layer, nn.ReLU):
            activations.append(x)
    return x


class Agent(nn.Module):
    def __init__(self, num_actions: int, separate_networks: bool):
        super().__init__()
        self.actor_encoder = nature_cnn()
        self.critic_encoder = nature_cnn() if separate_networks else None
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def features(self, obs: torch.Tensor, activations: list[torch.Tensor] | None = None):
        """Penultimate features (actor, critic); uint8 pixels are scaled here."""
        x = obs.float() / 255.0
        actor_features = run_encoder(self.actor_encoder, x, activations)
        if self.critic_encoder is None:
            return actor_features, actor_features
        return actor_features, run_encoder(self.critic_encoder, x, activations)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)[1]).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        actor_features, critic_features = self.features(obs)
        logits = self.actor(actor_features)
        distribution = Categorical(logits=logits)
        if action is None:
            action = distribution.sample()
        value = self.critic(critic_features).squeeze(-1)
        return action, distribution.log_prob(action), distribution.entropy(), value, logits


# --------------------------------------------------------------------------------------
# The maths of one iteration (small functions a test can call on hand-made tensors)
# --------------------------------------------------------------------------------------


def reset_step_mask(previous_done: torch.Tensor) -> torch.Tensor:
    """1.0 for real transitions, 0.0 for EnvPool's reset steps.

    After an episode ends (terminated or truncated), EnvPool's next step ignores the action
    and returns the next episode's first observation with reward 0: the transition taken
    from a final observation is not experience (cleanrl issue 475).
    """
    return 1.0 - previous_done.float()


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    valid: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) advantages and returns over a (T, N) rollout with reset steps masked.

    Row t holds s_t, a_t, r_t and whether s_{t+1} ended the episode. On a truncation,
    s_{t+1} is the real last observation (EnvPool returns it and resets one step later),
    so values[t + 1] is its value and we bootstrap from it; on a termination we do not.
    Either way the lambda-return stops there. Reset steps (valid = 0) get advantage 0.
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_advantage = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        following_value = next_value if t == num_steps - 1 else values[t + 1]
        episode_ends = torch.maximum(terminations[t], truncations[t])
        delta = rewards[t] + gamma * following_value * (1.0 - terminations[t]) - values[t]
        last_advantage = (delta + gamma * gae_lambda * (1.0 - episode_ends) * last_advantage) * valid[t]
        advantages[t] = last_advantage
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_ewma_loss(
    new_logprob: torch.Tensor,
    proximal_logprob: torch.Tensor,
    behavior_logprob: torch.Tensor,
    advantages: torch.Tensor,
    new_value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    clip_coef: float,
    clip_vloss: bool,
    ent_coef: float,
    vf_coef: float,
    importance_weight_cap: float = 100.0,
    norm_adv: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled clipped objective (Beukman et al. 2026 eq. 4) over one minibatch.

    (pi_prox / pi_behavior) * min(r_prox A, clip(r_prox, 1 - eps, 1 + eps) A) with
    r_prox = pi_theta / pi_prox; the importance weight carries no gradient and is capped.
    With pi_prox = pi_behavior this is exactly PPO's clipped loss. Masked entries do not count.
    """
    if norm_adv:
        mean = masked_mean(advantages, mask)
        std = masked_mean((advantages - mean).square(), mask).sqrt()
        advantages = (advantages - mean) / (std + 1e-8)
    importance_weight = (proximal_logprob - behavior_logprob).exp().clamp(max=importance_weight_cap).detach()
    proximal_ratio = (new_logprob - proximal_logprob).exp()
    clipped_ratio = proximal_ratio.clamp(1 - clip_coef, 1 + clip_coef)
    policy_loss = masked_mean(
        importance_weight * torch.max(-advantages * proximal_ratio, -advantages * clipped_ratio), mask
    )
    if clip_vloss:
        clipped_value = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        value_loss = 0.5 * masked_mean(
            torch.max((new_value - returns).square(), (clipped_value - returns).square()), mask
        )
    else:
        value_loss = 0.5 * masked_mean((new_value - returns).square(), mask)
    entropy_loss = masked_mean(entropy, mask)
    loss = policy_loss - ent_coef * entropy_loss + vf_coef * value_loss
    with torch.no_grad():
        log_ratio = new_logprob - behavior_logprob  # approx KL from the behaviour policy, as PPO logs it
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy_loss.detach(),
            "approx_kl": masked_mean((log_ratio.exp() - 1) - log_ratio, mask),  # Schulman's k3 estimator
            "clipfrac": masked_mean(((proximal_ratio - 1.0).abs() > clip_coef).float(), mask),
        }
    return loss, stats


@torch.no_grad()
def ewma_update(proximal: nn.Module, current: nn.Module, weight_sum: float, beta: float) -> float:
    """One bias-corrected EWMA step of the proximal weights towards the current ones.

    W' = beta W + 1;  theta_prox <- theta_prox * (beta W / W') + theta / W';  returns W'.
    theta_prox is then the beta-discounted average of every weight vector seen so far,
    the initial one included (W = 1 at the start), so there is no start-up bias.
    """
    new_weight_sum = beta * weight_sum + 1.0
    for proximal_tensor, tensor in zip(proximal.state_dict().values(), current.state_dict().values(), strict=True):
        if proximal_tensor.is_floating_point():
            proximal_tensor.mul_(beta * weight_sum / new_weight_sum).add_(tensor, alpha=1.0 / new_weight_sum)
    return new_weight_sum


@torch.no_grad()
def measure_agent(
    agent: Agent,
    obs: torch.Tensor,
    actions: torch.Tensor,
    behavior_logits: torch.Tensor,
    batch_size: int,
    dormant_tau: float,
    proximal: Agent,
) -> dict[str, float]:
    """The metrics/ tags that need a forward pass, on the states of the metrics batch.

    Called after the update: ratios and KL compare the updated policy with the policy that
    collected the rollout (the behaviour policy). DDR divides the training batch size by
    the KL estimated on these states.
    """
    activations: list[torch.Tensor] = []
    actor_features, critic_features = agent.features(obs, activations)
    logits = agent.actor(actor_features)
    new_logprob = Categorical(logits=logits).log_prob(actions)
    behavior_logprob = Categorical(logits=behavior_logits).log_prob(actions)
    kl_behavior = metrics.categorical_kl(behavior_logits, logits).mean().item()
    values = {
        "feature_rank": metrics.feature_rank(actor_features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_tau),
        "weight_norm": metrics.weight_norm(agent.parameters()),
        "ess_pct": metrics.ess_percentage((new_logprob - behavior_logprob).exp()),
        "policy_variance": metrics.categorical_policy_variance(torch.softmax(logits, dim=-1)),
        "kl_behavior": kl_behavior,
        "ddr": metrics.data_to_divergence_ratio(batch_size, kl_behavior),
    }
    if agent.critic_encoder is not None:
        values["feature_rank_critic"] = metrics.feature_rank(critic_features)
    # The outer step: how far the current policy is from the proximal one it is clipped to.
    proximal_logits = proximal.actor(proximal.features(obs)[0])
    values["kl_prox"] = metrics.categorical_kl(proximal_logits, logits).mean().item()
    return values


# --------------------------------------------------------------------------------------
# Run directory, checkpoints, video
# --------------------------------------------------------------------------------------


def save_checkpoint(
    path: str,
    agent: Agent,
    proximal: Agent,
    ewma_weight_sum: float,
    optimizer: torch.optim.Optimizer,
    args: Args,
    iteration: int,
    global_step: int,
):
    """Write atomically: a crash while saving leaves the previous checkpoint intact."""
    state = {
        "model": agent.state_dict(),
        "proximal": proximal.state_dict(),
        "ewma_weight_sum": ewma_weight_sum,
        "optimizer": optimizer.state_dict(),
        "args": asdict(args),
        "iteration": iteration,
        "global_step": global_step,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [np.random.get_state()[1].tolist(), *np.random.get_state()[2:]],  # plain data for weights_only
            "python": random.getstate(),
        },
    }
    temporary = f"{path}.tmp"
    torch.save(state, temporary)
    os.replace(temporary, path)


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    key, position, has_gauss, cached_gaussian = rng["numpy"]
    np.random.set_state(("MT19937", np.array(key, dtype=np.uint32), position, has_gauss, cached_gaussian))
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in rng["python"]))


def save_embeddings(path: str, embeddings: dict[str, list[np.ndarray]]) -> None:
    if not embeddings["features"]:
        return
    temporary = f"{path}.tmp.npz"
    np.savez_compressed(temporary, **{key: np.concatenate(chunks) for key, chunks in embeddings.items()})
    os.replace(temporary, path)


def record_video(agent: Agent, args: Args, run_dir: str, device: torch.device) -> str | None:
    """Play one episode of the final policy with gymnasium + ale-py and write an MP4.

    The preprocessing matches EnvPool's Atari defaults: 4-frame skip with max-pooling,
    up to 30 no-ops, 84x84 grayscale, 4 stacked frames, and FIRE after every reset or lost
    life (EnvPool's use_fire_reset) so the agent is never stuck on an unlaunched ball.
    """
    import ale_py  # noqa: PLC0415 - only needed for the video
    import gymnasium as gym  # noqa: PLC0415

    gym.register_envs(ale_py)
    game = args.env_id.split("-")[0]
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0, full_action_space=False,
                   max_num_frames_per_episode=4 * args.max_episode_steps, render_mode="rgb_array")  # fmt: skip
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
    env = gym.wrappers.FrameStackObservation(env, 4)
    video_dir = os.path.join(run_dir, "videos")
    env = gym.wrappers.RecordVideo(
        env, video_dir, episode_trigger=lambda _: True, name_prefix="eval", disable_logger=True
    )
    action_meanings = env.unwrapped.get_action_meanings()
    fire = action_meanings.index("FIRE") if "FIRE" in action_meanings else None
    obs, info = env.reset(seed=args.seed)
    lives, pending_fire = info.get("lives", 0), fire is not None
    total_return, done = 0.0, False
    while not done:
        if pending_fire:
            action = fire
        else:
            with torch.inference_mode():
                action = agent.get_action_and_value(torch.as_tensor(np.asarray(obs), device=device)[None])[0].item()
        obs, reward, terminated, truncated, info = env.step(action)
        total_return += float(reward)
        pending_fire = fire is not None and info.get("lives", 0) < lives
        lives = info.get("lives", 0)
        done = terminated or truncated
    env.close()
    videos = sorted(f for f in os.listdir(video_dir) if f.endswith(".mp4"))
    if not videos:
        print("warning: the evaluation episode produced no video file")
        return None
    print(f"video of one evaluation episode (return {total_return:g}): {os.path.join(video_dir, videos[-1])}")
    return os.path.join(video_dir, videos[-1])


class Progress:
    """One live line on a terminal; a plain line every `every` seconds otherwise (logs, Slurm)."""

    def __init__(self, total: int, start_step: int, every: float = 30.0):
        self.total, self.start_step, self.every = total, start_step, every
        self.interactive = sys.stdout.isatty()
        self.start_time = time.time()
        self.last_print, self.last_step = 0.0, -1

    def update(self, global_step: int, recent_return: float, final: bool = False) -> None:
        now = time.time()
        due = self.interactive or final or now - self.last_print >= self.every
        if not due or (global_step == self.last_step and not self.interactive):
            return
        self.last_print, self.last_step = now, global_step
        sps = (global_step - self.start_step) / max(now - self.start_time, 1e-9)
        eta = (self.total - global_step) / max(sps, 1e-9)
        line = (f"step {global_step:,}/{self.total:,} | {sps:,.0f} SPS | return {recent_return:.1f}"
                f" | ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}")  # fmt: skip
        if self.interactive:
            print(f"\r{line}\033[K", end="\n" if final else "", flush=True)
        else:
            print(line, flush=True)


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    checkpoint = None
    if args.resume is not None:
        if not os.path.isfile(args.resume):
            fail(f"--resume {args.resume!r}: no such checkpoint file")
        try:
            checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable file is a usage error here
            fail(f"--resume {args.resume!r} is not a readable checkpoint ({type(error).__name__})")
        if (
            not isinstance(checkpoint, dict)
            or not {"args", "model", "proximal", "optimizer", "iteration", "rng"} <= checkpoint.keys()
            or not isinstance(checkpoint["args"], dict)
            or not checkpoint["args"].keys() <= {field.name for field in fields(Args)}  # another script's run
        ):
            fail(f"--resume {args.resume!r} is not a checkpoint.pt of ppo_ewma_atari.py")
        args = Args(**{**checkpoint["args"], **{name: getattr(args, name) for name in RUNTIME_FLAGS}})
    args = validate_and_derive(args)

    if checkpoint is not None:
        run_dir = os.path.dirname(os.path.abspath(args.resume))
    else:
        run_dir = os.path.join(args.runs_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "args.json"), "w") as f:
            json.dump(asdict(args), f, indent=2)
    run_name = os.path.basename(run_dir)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")

    if args.track:
        import wandb  # noqa: PLC0415 - optional dependency at run time

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=asdict(args),
                   name=run_name, id=run_name.replace("/", "_"), resume="allow", dir=run_dir, save_code=True)  # fmt: skip
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - slow import, after validation

    writer = SummaryWriter(run_dir)
    if checkpoint is None:
        table = "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.cuda and not torch.cuda.is_available():
        print("notice: CUDA is not available, training on the CPU")
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")

    import envpool  # noqa: PLC0415

    start_iteration, global_step = 1, 0
    if checkpoint is not None:
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]
    # A resumed run starts fresh episodes from a different env seed (EnvPool state is not saved).
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=args.seed + start_iteration - 1,
                        max_episode_steps=args.max_episode_steps, episodic_life=True, reward_clip=True)  # fmt: skip
    num_actions = envs.action_space.n

    agent = Agent(num_actions, args.separate_networks).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.scaled_learning_rate, eps=args.adam_eps)
    # The proximal policy starts at the initial weights with EWMA weight W = 1 and is kept
    # across iterations (it is not reset to the behaviour policy).
    proximal = copy.deepcopy(agent).requires_grad_(False)
    ewma_beta, ewma_weight_sum = args.ewma_com / (args.ewma_com + 1.0), 1.0
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        proximal.load_state_dict(checkpoint["proximal"])
        ewma_weight_sum = checkpoint["ewma_weight_sum"]
        optimizer.load_state_dict(checkpoint["optimizer"])
        restore_rng(checkpoint["rng"])
        print(f"resumed {run_dir} at iteration {start_iteration} (global step {global_step:,})")

    embeddings_path = os.path.join(run_dir, "embeddings.npz")
    embeddings: dict[str, list[np.ndarray]] = {"features": [], "values": [], "iteration": [], "global_step": []}
    if args.save_embeddings and os.path.exists(embeddings_path):
        with np.load(embeddings_path) as saved_embeddings:
            for key, chunks in embeddings.items():
                chunks.append(saved_embeddings[key])

    # Rollout storage on the training device; pixels stay uint8 until the network.
    rollout_shape = (args.num_steps, args.num_envs)
    rollout_obs = torch.zeros(rollout_shape + envs.observation_space.shape, dtype=torch.uint8, device=device)
    rollout_actions = torch.zeros(rollout_shape, dtype=torch.long, device=device)
    rollout_logprobs = torch.zeros(rollout_shape, device=device)
    rollout_logits = torch.zeros(rollout_shape + (num_actions,), device=device)
    rollout_rewards = torch.zeros(rollout_shape, device=device)
    rollout_terminations = torch.zeros(rollout_shape, device=device)
    rollout_truncations = torch.zeros(rollout_shape, device=device)
    rollout_valid = torch.zeros(rollout_shape, device=device)
    rollout_values = torch.zeros(rollout_shape, device=device)

    # SIGTERM (Slurm pre-emption, kill) and SIGINT (Ctrl-C) ask for a checkpoint and a clean exit.
    stop_signal: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))

    next_obs_np, _ = envs.reset()
    next_obs = torch.as_tensor(next_obs_np, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    # Full-game statistics: EnvPool's episodic_life ends an "episode" per life, but the
    # score that matters is the whole game (info["terminated"] marks the real game over).
    game_return = np.zeros(args.num_envs)
    recent_returns: deque[float] = deque(maxlen=20)
    progress = Progress(args.total_timesteps, global_step)
    completed_iteration = start_iteration - 1
    start_time, start_step = time.time(), global_step

    for iteration in range(start_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (
                1.0 - (iteration - 1.0) / args.num_iterations
            ) * args.scaled_learning_rate

        for step in range(args.num_steps):
            if stop_signal:
                break
            global_step += args.num_envs
            rollout_obs[step] = next_obs
            rollout_valid[step] = reset_step_mask(next_done)
            with torch.inference_mode():
                action, logprob, _, value, logits = agent.get_action_and_value(next_obs)
            rollout_values[step] = value
            rollout_actions[step] = action
            rollout_logprobs[step] = logprob
            rollout_logits[step] = logits

            next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())
            next_obs = torch.as_tensor(next_obs_np, device=device)
            rollout_rewards[step] = torch.as_tensor(reward, device=device)
            rollout_terminations[step] = torch.as_tensor(terminations, device=device)
            rollout_truncations[step] = torch.as_tensor(truncations, device=device)
            next_done = torch.maximum(rollout_terminations[step], rollout_truncations[step])

            game_return += info["reward"]  # unclipped reward; 0 on reset steps
            game_over = info["terminated"].astype(bool) | truncations
            if game_over.any():
                for finished_return, finished_length in zip(
                    game_return[game_over], info["elapsed_step"][game_over], strict=True
                ):
                    writer.add_scalar("charts/episodic_return", finished_return, global_step)
                    writer.add_scalar("charts/episodic_length", finished_length, global_step)
                    recent_returns.append(float(finished_return))
                game_return[game_over] = 0.0
        if stop_signal:
            global_step -= step * args.num_envs  # the interrupted rollout is discarded
            break

        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            advantages, returns = compute_gae(rollout_rewards, rollout_values, rollout_terminations, rollout_truncations,
                                              rollout_valid, next_value, args.gamma, args.gae_lambda)  # fmt: skip

        batch_obs = rollout_obs.reshape((-1,) + envs.observation_space.shape)
        batch_actions = rollout_actions.reshape(-1)
        batch_logprobs = rollout_logprobs.reshape(-1)
        batch_logits = rollout_logits.reshape(-1, num_actions)
        batch_advantages = advantages.reshape(-1)
        batch_returns = returns.reshape(-1)
        batch_values = rollout_values.reshape(-1)
        batch_valid = rollout_valid.reshape(-1)

        measure = args.metrics_interval > 0 and (
            iteration % args.metrics_interval == 0 or iteration == args.num_iterations
        )
        grad_norms, minibatch_stats = [], []
        gradient_kurtosis = None
        for _epoch in range(args.update_epochs):
            permutation = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = permutation[start : start + args.minibatch_size]
                _, new_logprob, entropy, new_value, _ = agent.get_action_and_value(batch_obs[mb], batch_actions[mb])
                with torch.no_grad():
                    proximal_logprob = proximal.get_action_and_value(batch_obs[mb], batch_actions[mb])[1]
                loss, stats = ppo_ewma_loss(new_logprob, proximal_logprob, batch_logprobs[mb], batch_advantages[mb],
                                            new_value, batch_values[mb], batch_returns[mb], entropy, batch_valid[mb],
                                            args.clip_coef, args.clip_vloss, args.ent_coef, args.vf_coef,
                                            args.importance_weight_cap, args.norm_adv)  # fmt: skip
                optimizer.zero_grad()
                loss.backward()
                if measure and gradient_kurtosis is None:
                    gradient_kurtosis = metrics.gradient_kurtosis(
                        p.grad for p in agent.parameters() if p.grad is not None
                    )
                grad_norms.append(nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm))
                optimizer.step()
                ewma_weight_sum = ewma_update(proximal, agent, ewma_weight_sum, ewma_beta)
                minibatch_stats.append(stats)
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break

        valid = batch_valid.bool()
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for name in minibatch_stats[0]:  # means over the update's minibatches
            writer.add_scalar(
                f"losses/{name}", torch.stack([s[name] for s in minibatch_stats]).mean().item(), global_step
            )
        writer.add_scalar(
            "losses/explained_variance",
            metrics.explained_variance(batch_values[valid], batch_returns[valid]),
            global_step,
        )

        if measure:
            valid_index = torch.nonzero(valid).squeeze(1)
            sample = valid_index[torch.randperm(valid_index.numel(), device=device)[: args.metrics_batch]]
            measured = measure_agent(
                agent,
                batch_obs[sample],
                batch_actions[sample],
                batch_logits[sample],
                args.batch_size,
                args.dormant_tau,
                proximal,
            )
            measured["grad_kurtosis"] = gradient_kurtosis
            measured["grad_norm"] = torch.stack(grad_norms).mean().item()
            for name, value in measured.items():
                writer.add_scalar(f"metrics/{name}", value, global_step)
            if args.save_embeddings:
                keep = sample[: args.embeddings_per_iteration]
                with torch.no_grad():
                    features, critic_features = agent.features(batch_obs[keep])
                    values = agent.critic(critic_features).squeeze(-1)
                embeddings["features"].append(features.cpu().numpy().astype(np.float16))
                embeddings["values"].append(values.cpu().numpy())
                embeddings["iteration"].append(np.full(keep.numel(), iteration))
                embeddings["global_step"].append(np.full(keep.numel(), global_step))

        # After the metrics, so that SPS counts everything an iteration costs.
        writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
        completed_iteration = iteration
        progress.update(global_step, np.mean(recent_returns) if recent_returns else float("nan"))
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(checkpoint_path, agent, proximal, ewma_weight_sum, optimizer, args, iteration, global_step)
            if args.save_embeddings:
                save_embeddings(embeddings_path, embeddings)

    envs.close()
    if args.save_embeddings:
        save_embeddings(embeddings_path, embeddings)
    if stop_signal:
        save_checkpoint(
            checkpoint_path, agent, proximal, ewma_weight_sum, optimizer, args, completed_iteration, global_step
        )
        writer.close()
        print(
            f"\nstopped by signal {stop_signal[0]}: checkpoint at {checkpoint_path}; continue with --resume {checkpoint_path}"
        )
        sys.exit(128 + stop_signal[0])

    progress.update(global_step, np.mean(recent_returns) if recent_returns else float("nan"), final=True)
    if args.checkpoint_interval:
        save_checkpoint(
            checkpoint_path, agent, proximal, ewma_weight_sum, optimizer, args, completed_iteration, global_step
        )
    if args.save_model:
        model_path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        torch.save(agent.state_dict(), f"{model_path}.tmp")
        os.replace(f"{model_path}.tmp", model_path)
        print(f"model saved to {model_path}")
    if args.capture_video:
        record_video(agent, args, run_dir, device)
    writer.close()
    # Completion marker: sweeps/launch.sh skips run directories that have one.
    with open(os.path.join(run_dir, "done.json"), "w") as f:
        json.dump({"global_step": global_step, "iterations": completed_iteration}, f)
    if args.track:
        wandb.finish()


if __name__ == "__main__":
    main()
