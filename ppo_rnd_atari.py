"""PPO + Random Network Distillation on hard-exploration Atari (EnvPool, gymnasium API).

    python ppo_rnd_atari.py --env-id MontezumaRevenge-v5 --num-envs 128 --num-steps 128

Burda et al. 2019, "Exploration by Random Network Distillation", with CleanRL's RND
reference settings (sticky actions, 128 envs x 128 steps, gamma_ext 0.999, gamma_int 0.99,
ext/int advantage coefficients 2/1, predictor trained on 25 % of each minibatch), on top of
the PPO of `ppo_atari_envpool.py`:
- a frozen random target network and a trained predictor see the last frame of the next
  observation, normalised by a running mean/std of observations (warmed up with random
  actions before training) and clipped to [-5, 5]; the intrinsic reward is the predictor's
  mean squared error, divided by the running std of the discounted intrinsic return;
- the policy/value network has two value heads; extrinsic GAE is episodic (as in PPO),
  intrinsic GAE is non-episodic (it runs on through episode ends);
- EnvPool's reset step (the step after an episode ends returns the next episode's first
  observation and ignores the action) is masked out of every loss, advantage, statistic
  and metric, as in `ppo_atari_envpool.py`;
- the study's metrics, `--separate-networks`, `--minibatch-size`, `--lr-scaling`, atomic
  checkpoints (with the normalisers), SIGTERM/SIGINT checkpointing and `--resume`.
"""

from __future__ import annotations

import contextlib
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
from dataclasses import asdict, dataclass
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
    """save the final policy/value network to runs/.../{exp_name}.cleanrl_model"""
    checkpoint_interval: int = 0
    """write runs/.../checkpoint.pt every this many iterations (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from (its run's flags are used)"""

    # Environment
    env_id: str = "MontezumaRevenge-v5"
    """EnvPool Atari task id"""
    total_timesteps: int = 10_000_000
    """total environment steps (the observation-normalisation warm-up is not counted)"""
    max_episode_steps: int = 27_000
    """time limit in agent steps (27,000 = 108,000 frames, 30 minutes of play): the game is truncated there"""
    repeat_action_probability: float = 0.25
    """sticky actions: probability that the emulator repeats the previous action (Machado et al. 2018)"""
    num_envs: int = 128
    """N_envs: parallel environments"""
    num_steps: int = 128
    """N_RO: rollout length per environment and iteration"""

    # Optimisation
    learning_rate: float = 1e-4
    """Adam learning rate (before --lr-scaling)"""
    lr_scaling: Literal["none", "sqrt", "linear", "inverse"] = "none"
    """multiply the LR by sqrt(k), k or 1/k with k = num_envs / lr_reference_envs (paper Fig. 11)"""
    lr_reference_envs: int = 128
    """num_envs at which --lr-scaling leaves the LR unchanged"""
    anneal_lr: bool = True
    """anneal the LR linearly to 0 over training"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    gamma: float = 0.999
    """discount factor of the extrinsic (game) reward"""
    int_gamma: float = 0.99
    """discount factor of the intrinsic (RND) reward"""
    gae_lambda: float = 0.95
    """GAE lambda (both reward streams)"""
    update_epochs: int = 4
    """epochs over each rollout"""
    num_minibatches: int = 4
    """minibatches per epoch (ignored when --minibatch-size is given)"""
    minibatch_size: int | None = None
    """fix the minibatch size instead; the number of minibatches is derived (Beukman et al. 2026)"""
    norm_adv: bool = True
    """normalise the combined advantages per minibatch"""
    clip_coef: float = 0.1
    """PPO surrogate clipping epsilon"""
    clip_vloss: bool = True
    """clip both value losses around the old values"""
    ent_coef: float = 0.001
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient (applied to the sum of the extrinsic and intrinsic value losses)"""
    max_grad_norm: float = 0.5
    """global gradient norm clipping (policy/value network and predictor together)"""
    target_kl: float | None = None
    """stop the epochs early when approx KL exceeds this"""
    separate_networks: bool = False
    """actor and critics get their own Nature-CNN encoder (paper Fig. 5)"""

    # RND
    ext_coef: float = 2.0
    """weight of the extrinsic advantages in the combined advantage"""
    int_coef: float = 1.0
    """weight of the intrinsic advantages in the combined advantage"""
    update_proportion: float = 0.25
    """fraction of each minibatch's states (random mask) used in the predictor loss"""
    num_iterations_obs_norm_init: int = 50
    """observation-normalisation warm-up: this many x num_steps random-action steps before training"""

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
CHECKPOINT_KEYS = {"args", "model", "rnd", "optimizer", "normalisers", "iteration", "global_step", "warmup_steps",
                   "rng"}  # fmt: skip
FRAME_SHAPE = (1, 84, 84)  # RND sees the last frame of the stacked observation


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
    for name in ("checkpoint_interval", "metrics_interval", "ent_coef", "vf_coef", "dormant_tau", "ext_coef", "int_coef",
                 "num_iterations_obs_norm_init"):  # fmt: skip
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("learning_rate", "adam_eps", "clip_coef", "max_grad_norm"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("gamma", "int_gamma", "gae_lambda", "repeat_action_probability"):
        if not 0 <= getattr(args, name) <= 1:
            fail(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if not 0 < args.update_proportion <= 1:
        fail(f"--update-proportion must be in (0, 1], got {args.update_proportion}")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be > 0, got {args.target_kl}")
    try:
        is_atari = type(envpool.make_spec(args.env_id)).__name__ == "AtariEnvSpec"
    except Exception:  # noqa: BLE001 - unknown ids, and families whose runtime is missing (Procgen without Qt)
        is_atari = False
    if not is_atari:
        fail(
            f"--env-id {args.env_id!r} is not an EnvPool Atari task (e.g. MontezumaRevenge-v5, Venture-v5, Breakout-v5)"
        )

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
# Networks
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
    """Nature-CNN policy with an extrinsic and an intrinsic value head."""

    def __init__(self, num_actions: int, separate_networks: bool):
        super().__init__()
        self.actor_encoder = nature_cnn()
        self.critic_encoder = nature_cnn() if separate_networks else None
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic_ext = layer_init(nn.Linear(512, 1), std=1)
        self.critic_int = layer_init(nn.Linear(512, 1), std=1)

    def features(self, obs: torch.Tensor, activations: list[torch.Tensor] | None = None):
        """Penultimate features (actor, critic); uint8 pixels are scaled here."""
        x = obs.float() / 255.0
        actor_features = run_encoder(self.actor_encoder, x, activations)
        if self.critic_encoder is None:
            return actor_features, actor_features
        return actor_features, run_encoder(self.critic_encoder, x, activations)

    def get_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(extrinsic value, intrinsic value)"""
        critic_features = self.features(obs)[1]
        return self.critic_ext(critic_features).squeeze(-1), self.critic_int(critic_features).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        actor_features, critic_features = self.features(obs)
        logits = self.actor(actor_features)
        distribution = Categorical(logits=logits)
        if action is None:
            action = distribution.sample()
        ext_value = self.critic_ext(critic_features).squeeze(-1)
        int_value = self.critic_int(critic_features).squeeze(-1)
        return action, distribution.log_prob(action), distribution.entropy(), ext_value, int_value, logits


def rnd_convolutions() -> list[nn.Module]:
    """Burda et al.'s RND encoder on one 84x84 frame: Nature-CNN convolutions with leaky ReLUs."""
    return [
        layer_init(nn.Conv2d(1, 32, 8, stride=4)),
        nn.LeakyReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)),
        nn.LeakyReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)),
        nn.LeakyReLU(),
        nn.Flatten(),
    ]


class RNDModel(nn.Module):
    """A random, frozen target network and the predictor trained to match it (512 features each)."""

    def __init__(self, feature_dim: int = 512):
        super().__init__()
        self.target = nn.Sequential(*rnd_convolutions(), layer_init(nn.Linear(64 * 7 * 7, feature_dim)))
        self.predictor = nn.Sequential(
            *rnd_convolutions(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
            layer_init(nn.Linear(512, 512)),
            nn.ReLU(),
            layer_init(nn.Linear(512, feature_dim)),
        )
        for parameter in self.target.parameters():
            parameter.requires_grad_(False)

    def forward(self, normalised_frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(predicted features, target features) of normalised (B, 1, 84, 84) frames."""
        return self.predictor(normalised_frames), self.target(normalised_frames)


# --------------------------------------------------------------------------------------
# Normalisers (running statistics on the training device, saved in checkpoints)
# --------------------------------------------------------------------------------------


def merge_moments(
    mean: torch.Tensor,
    var: torch.Tensor,
    count: torch.Tensor,
    batch_mean: torch.Tensor,
    batch_var: torch.Tensor,
    batch_count: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chan et al.'s parallel update: moments of two sets from the moments of each.

    `var` and `batch_var` are population variances (divide by the count); with count 0 the
    result is the batch's moments.
    """
    total = count + batch_count
    delta = batch_mean - mean
    new_mean = mean + delta * (batch_count / total)
    sum_of_squares = var * count + batch_var * batch_count + delta.square() * (count * batch_count / total)
    return new_mean, sum_of_squares / total, total


class RunningMeanStd:
    """Running mean and variance of a stream of (B, *shape) batches, merged batch by batch."""

    def __init__(self, shape: tuple[int, ...] = (), device: torch.device | str = "cpu"):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(self, batch: torch.Tensor, chunk_size: int = 4096) -> None:
        """Merge a batch of any dtype (uint8 frames too) in chunks to bound the float copies."""
        for chunk in batch.split(chunk_size):
            if chunk.shape[0] == 0:
                continue
            batch_var, batch_mean = torch.var_mean(chunk.to(torch.float32), dim=0, correction=0)
            self.mean, self.var, self.count = merge_moments(
                self.mean, self.var, self.count, batch_mean.double(), batch_var.double(), chunk.shape[0]
            )

    @property
    def std(self) -> torch.Tensor:
        return (self.var + 1e-8).sqrt()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean.cpu(), "var": self.var.cpu(), "count": self.count.cpu()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        device = self.mean.device
        self.mean, self.var, self.count = (state[key].to(device, torch.float64) for key in ("mean", "var", "count"))


def normalise_frames(frames: torch.Tensor, obs_rms: RunningMeanStd) -> torch.Tensor:
    """RND input: (frame - running mean) / running std, clipped to [-5, 5] (Burda et al.)."""
    return ((frames.float() - obs_rms.mean.float()) / obs_rms.std.float()).clamp(-5.0, 5.0)


def reward_forward_filter(
    rewards: torch.Tensor, valid: torch.Tensor, running: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted intrinsic return run forward in time over a (T, N) rollout: R_t = gamma R_{t-1} + r_t.

    Burda et al. divide the intrinsic reward by the running std of these returns. The
    filter never restarts (intrinsic returns are non-episodic); reset steps (valid = 0) are
    not experience and leave it unchanged. Returns the per-step values and the final state
    (N,), which carries over to the next rollout.
    """
    filtered = torch.zeros_like(rewards)
    for t in range(rewards.shape[0]):
        running = torch.where(valid[t].bool(), gamma * running + rewards[t], running)
        filtered[t] = running
    return filtered, running


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
    """Episodic GAE(lambda) for the extrinsic reward over a (T, N) rollout, reset steps masked.

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


def compute_intrinsic_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-episodic GAE(lambda) for the intrinsic reward over a (T, N) rollout (Burda et al.).

    Episode ends do not stop the intrinsic return: a terminated or truncated transition
    bootstraps and the lambda-chain goes on into the next episode. EnvPool's reset step
    (valid = 0) is skipped as if it did not exist: it gets advantage 0, and the transition
    before it bootstraps from the value of the next real state (the first state of the new
    episode) and continues that state's lambda-chain. At the end of the rollout the chain
    bootstraps from `next_value`, the value of the observation after the last row.
    """
    advantages = torch.zeros_like(rewards)
    following_value = next_value
    following_advantage = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * following_value - values[t]
        advantage = delta + gamma * gae_lambda * following_advantage
        real = valid[t].bool()
        advantages[t] = torch.where(real, advantage, torch.zeros_like(advantage))
        following_value = torch.where(real, values[t], following_value)
        following_advantage = torch.where(real, advantage, following_advantage)
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def rnd_error(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-state mean squared prediction error over the features: the raw intrinsic reward."""
    return (predicted - target).square().mean(dim=-1)


def clipped_value_loss(
    new_value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_coef: float,
    clip_vloss: bool,
) -> torch.Tensor:
    """0.5 * squared error to the returns, pessimistically clipped around the old values (PPO)."""
    if not clip_vloss:
        return 0.5 * masked_mean((new_value - returns).square(), mask)
    clipped_value = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
    return 0.5 * masked_mean(torch.max((new_value - returns).square(), (clipped_value - returns).square()), mask)


def ppo_rnd_loss(
    new_logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    new_ext_value: torch.Tensor,
    old_ext_value: torch.Tensor,
    ext_returns: torch.Tensor,
    new_int_value: torch.Tensor,
    old_int_value: torch.Tensor,
    int_returns: torch.Tensor,
    entropy: torch.Tensor,
    predicted_features: torch.Tensor,
    target_features: torch.Tensor,
    mask: torch.Tensor,
    rnd_mask: torch.Tensor,
    clip_coef: float,
    clip_vloss: bool,
    ent_coef: float,
    vf_coef: float,
    norm_adv: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped objective on the combined advantage + both value losses + the predictor loss.

    `advantages` is ext_coef * A_ext + int_coef * A_int. The value loss is the sum of the
    extrinsic and intrinsic (clipped) value losses. The predictor (RND) loss is the mean
    prediction error over the states with rnd_mask 1 (a random `update_proportion` of the
    real transitions); the target features get no gradient. Entries with mask 0 (reset
    steps) count nowhere.
    """
    if norm_adv:
        mean = masked_mean(advantages, mask)
        std = masked_mean((advantages - mean).square(), mask).sqrt()
        advantages = (advantages - mean) / (std + 1e-8)
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    policy_loss = masked_mean(
        torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)), mask
    )
    ext_value_loss = clipped_value_loss(new_ext_value, old_ext_value, ext_returns, mask, clip_coef, clip_vloss)
    int_value_loss = clipped_value_loss(new_int_value, old_int_value, int_returns, mask, clip_coef, clip_vloss)
    value_loss = ext_value_loss + int_value_loss
    entropy_loss = masked_mean(entropy, mask)
    rnd_loss = masked_mean(rnd_error(predicted_features, target_features.detach()), rnd_mask * mask)
    loss = policy_loss - ent_coef * entropy_loss + vf_coef * value_loss + rnd_loss
    with torch.no_grad():
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "ext_value_loss": ext_value_loss.detach(),
            "int_value_loss": int_value_loss.detach(),
            "entropy": entropy_loss.detach(),
            "rnd_loss": rnd_loss.detach(),
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),  # Schulman's k3 estimator
            "clipfrac": masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask),
        }
    return loss, stats


@torch.no_grad()
def measure_agent(
    agent: Agent,
    obs: torch.Tensor,
    actions: torch.Tensor,
    behavior_logits: torch.Tensor,
    batch_size: int,
    dormant_tau: float,
) -> dict[str, float]:
    """The metrics/ tags that need a forward pass, on the states of the metrics batch.

    As in ppo_atari_envpool.py, on the policy/value network (the RND networks are not
    measured). Called after the update: ratios and KL compare the updated policy with the
    policy that collected the rollout (the behaviour policy). DDR divides the training
    batch size by the KL estimated on these states.
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
    return values


# --------------------------------------------------------------------------------------
# Run directory, checkpoints, video
# --------------------------------------------------------------------------------------


def save_checkpoint(
    path: str,
    agent: Agent,
    rnd: RNDModel,
    optimizer: torch.optim.Optimizer,
    normalisers: dict,
    args: Args,
    iteration: int,
    global_step: int,
    warmup_steps: int,
) -> None:
    """Write atomically: a crash while saving leaves the previous checkpoint intact."""
    state = {
        "model": agent.state_dict(),
        "rnd": rnd.state_dict(),
        "optimizer": optimizer.state_dict(),
        "normalisers": normalisers,
        "args": asdict(args),
        "iteration": iteration,
        "global_step": global_step,
        "warmup_steps": warmup_steps,
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
    life (EnvPool's use_fire_reset); sticky actions as in training.
    """
    import ale_py  # noqa: PLC0415 - only needed for the video
    import gymnasium as gym  # noqa: PLC0415

    gym.register_envs(ale_py)
    game = args.env_id.split("-")[0]
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=args.repeat_action_probability,
                   full_action_space=False, max_num_frames_per_episode=4 * args.max_episode_steps,
                   render_mode="rgb_array")  # fmt: skip
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


def finished_games(game_return: np.ndarray, info: dict, truncations: np.ndarray) -> list[tuple[float, int]]:
    """Add one step's unclipped rewards to the full-game returns; pop the games that ended.

    EnvPool's episodic_life ends an "episode" per life, but the score that matters is the
    whole game: info["terminated"] marks the real game over, a truncation ends it too.
    """
    game_return += info["reward"]  # unclipped reward; 0 on reset steps
    game_over = info["terminated"].astype(bool) | truncations
    finished = list(zip(game_return[game_over].tolist(), info["elapsed_step"][game_over].tolist(), strict=True))
    game_return[game_over] = 0.0
    return finished


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
        if not isinstance(checkpoint, dict) or not CHECKPOINT_KEYS <= checkpoint.keys():
            fail(f"--resume {args.resume!r} is not a checkpoint.pt of ppo_rnd_atari.py")
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

    start_iteration, global_step, warmup_steps = 1, 0, 0
    if checkpoint is not None:
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]
        warmup_steps = checkpoint["warmup_steps"]
    # A resumed run starts fresh episodes from a different env seed (EnvPool state is not saved).
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=args.seed + start_iteration - 1,
                        max_episode_steps=args.max_episode_steps, episodic_life=True, reward_clip=True,
                        repeat_action_probability=args.repeat_action_probability)  # fmt: skip
    num_actions = envs.action_space.n

    agent = Agent(num_actions, args.separate_networks).to(device)
    rnd = RNDModel().to(device)
    trained_parameters = [*agent.parameters(), *rnd.predictor.parameters()]
    optimizer = torch.optim.Adam(trained_parameters, lr=args.scaled_learning_rate, eps=args.adam_eps)
    obs_rms = RunningMeanStd(FRAME_SHAPE, device)
    int_return_rms = RunningMeanStd((), device)
    int_return_filter = torch.zeros(args.num_envs, device=device)
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        rnd.load_state_dict(checkpoint["rnd"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        obs_rms.load_state_dict(checkpoint["normalisers"]["obs"])
        int_return_rms.load_state_dict(checkpoint["normalisers"]["int_return"])
        int_return_filter = checkpoint["normalisers"]["int_return_filter"].to(device)
        restore_rng(checkpoint["rng"])
        print(f"resumed {run_dir} at iteration {start_iteration} (global step {global_step:,})")

    def normalisers() -> dict:
        return {"obs": obs_rms.state_dict(), "int_return": int_return_rms.state_dict(),
                "int_return_filter": int_return_filter.cpu()}  # fmt: skip

    embeddings_path = os.path.join(run_dir, "embeddings.npz")
    embeddings: dict[str, list[np.ndarray]] = {
        "features": [], "values": [], "int_values": [], "iteration": [], "global_step": []
    }  # fmt: skip
    if args.save_embeddings and os.path.exists(embeddings_path):
        with np.load(embeddings_path) as saved_embeddings:
            for key, chunks in embeddings.items():
                chunks.append(saved_embeddings[key])

    # Rollout storage on the training device; pixels stay uint8 until the networks.
    rollout_shape = (args.num_steps, args.num_envs)
    obs_shape = envs.observation_space.shape
    rollout_obs = torch.zeros(rollout_shape + obs_shape, dtype=torch.uint8, device=device)
    rollout_next_frames = torch.zeros(rollout_shape + FRAME_SHAPE, dtype=torch.uint8, device=device)
    rollout_actions = torch.zeros(rollout_shape, dtype=torch.long, device=device)
    rollout_logprobs = torch.zeros(rollout_shape, device=device)
    rollout_logits = torch.zeros(rollout_shape + (num_actions,), device=device)
    rollout_rewards = torch.zeros(rollout_shape, device=device)
    rollout_int_errors = torch.zeros(rollout_shape, device=device)
    rollout_terminations = torch.zeros(rollout_shape, device=device)
    rollout_truncations = torch.zeros(rollout_shape, device=device)
    rollout_valid = torch.zeros(rollout_shape, device=device)
    rollout_ext_values = torch.zeros(rollout_shape, device=device)
    rollout_int_values = torch.zeros(rollout_shape, device=device)

    # SIGTERM (Slurm pre-emption, kill) and SIGINT (Ctrl-C) ask for a checkpoint and a clean exit.
    stop_signal: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))

    next_obs_np, _ = envs.reset()
    next_obs = torch.as_tensor(next_obs_np, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    game_return = np.zeros(args.num_envs)
    recent_returns: deque[float] = deque(maxlen=20)

    # Observation-normalisation warm-up (Burda et al.): random actions, only the observation
    # statistics learn, over the next observations of real transitions (the RND inputs).
    # Not counted in global_step; an interrupted warm-up continues on --resume.
    warmup_total = args.num_iterations_obs_norm_init * args.num_steps
    if warmup_steps < warmup_total:
        print(f"observation-normalisation warm-up: {(warmup_total - warmup_steps) * args.num_envs:,} random-action "
              "steps (not counted in global_step)", flush=True)  # fmt: skip
    while warmup_steps < warmup_total and not stop_signal:
        real = next_done == 0
        next_obs_np, _, terminations, truncations, info = envs.step(np.random.randint(num_actions, size=args.num_envs))
        next_obs = torch.as_tensor(next_obs_np, device=device)
        obs_rms.update(next_obs[real, -1:])
        next_done = torch.as_tensor(terminations | truncations, dtype=torch.float32, device=device)
        finished_games(game_return, info, truncations)  # keeps the full-game returns right; not logged
        warmup_steps += 1

    progress = Progress(args.total_timesteps, global_step)
    completed_iteration = start_iteration - 1
    start_time, start_step = time.time(), global_step

    for iteration in range(start_iteration, args.num_iterations + 1):
        if stop_signal:
            break
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
                action, logprob, _, ext_value, int_value, logits = agent.get_action_and_value(next_obs)
            rollout_ext_values[step] = ext_value
            rollout_int_values[step] = int_value
            rollout_actions[step] = action
            rollout_logprobs[step] = logprob
            rollout_logits[step] = logits

            next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())
            next_obs = torch.as_tensor(next_obs_np, device=device)
            rollout_next_frames[step] = next_obs[:, -1:]
            with torch.inference_mode():
                rollout_int_errors[step] = rnd_error(*rnd(normalise_frames(next_obs[:, -1:], obs_rms)))
            rollout_rewards[step] = torch.as_tensor(reward, device=device)
            rollout_terminations[step] = torch.as_tensor(terminations, device=device)
            rollout_truncations[step] = torch.as_tensor(truncations, device=device)
            next_done = torch.maximum(rollout_terminations[step], rollout_truncations[step])

            for finished_return, finished_length in finished_games(game_return, info, truncations):
                writer.add_scalar("charts/episodic_return", finished_return, global_step)
                writer.add_scalar("charts/episodic_length", finished_length, global_step)
                recent_returns.append(finished_return)
        if stop_signal:
            global_step -= step * args.num_envs  # the interrupted rollout is discarded
            break

        # Intrinsic reward: prediction error / running std of the discounted intrinsic return.
        valid = rollout_valid.bool()
        raw_int_rewards = rollout_int_errors * rollout_valid
        filtered_returns, int_return_filter = reward_forward_filter(
            raw_int_rewards, rollout_valid, int_return_filter, args.int_gamma
        )
        int_return_rms.update(filtered_returns[valid])
        int_rewards = raw_int_rewards / int_return_rms.std.float()

        with torch.no_grad():
            next_ext_value, next_int_value = agent.get_value(next_obs)
            ext_advantages, ext_returns = compute_gae(rollout_rewards, rollout_ext_values, rollout_terminations,
                                                      rollout_truncations, rollout_valid, next_ext_value, args.gamma,
                                                      args.gae_lambda)  # fmt: skip
            int_advantages, int_returns = compute_intrinsic_gae(
                int_rewards, rollout_int_values, rollout_valid, next_int_value, args.int_gamma, args.gae_lambda
            )
            advantages = args.ext_coef * ext_advantages + args.int_coef * int_advantages
        # The predictor is trained on inputs normalised with the statistics including this rollout.
        obs_rms.update(rollout_next_frames[valid])

        batch_obs = rollout_obs.reshape((-1,) + obs_shape)
        batch_next_frames = rollout_next_frames.reshape((-1,) + FRAME_SHAPE)
        batch_actions = rollout_actions.reshape(-1)
        batch_logprobs = rollout_logprobs.reshape(-1)
        batch_logits = rollout_logits.reshape(-1, num_actions)
        batch_advantages = advantages.reshape(-1)
        batch_ext_returns = ext_returns.reshape(-1)
        batch_int_returns = int_returns.reshape(-1)
        batch_ext_values = rollout_ext_values.reshape(-1)
        batch_int_values = rollout_int_values.reshape(-1)
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
                _, new_logprob, entropy, new_ext_value, new_int_value, _ = agent.get_action_and_value(
                    batch_obs[mb], batch_actions[mb]
                )
                predicted_features, target_features = rnd(normalise_frames(batch_next_frames[mb], obs_rms))
                rnd_mask = (torch.rand(mb.numel(), device=device) < args.update_proportion).float()
                loss, stats = ppo_rnd_loss(
                    new_logprob, batch_logprobs[mb], batch_advantages[mb],
                    new_ext_value, batch_ext_values[mb], batch_ext_returns[mb],
                    new_int_value, batch_int_values[mb], batch_int_returns[mb],
                    entropy, predicted_features, target_features, batch_valid[mb], rnd_mask,
                    args.clip_coef, args.clip_vloss, args.ent_coef, args.vf_coef, args.norm_adv,
                )  # fmt: skip
                optimizer.zero_grad()
                loss.backward()
                if measure:  # the metrics measure the policy/value network, as in ppo_atari_envpool.py
                    agent_gradients = [p.grad for p in agent.parameters() if p.grad is not None]
                    if gradient_kurtosis is None:
                        gradient_kurtosis = metrics.gradient_kurtosis(agent_gradients)
                    grad_norms.append(metrics.global_grad_norm(agent_gradients))
                nn.utils.clip_grad_norm_(trained_parameters, args.max_grad_norm)
                optimizer.step()
                minibatch_stats.append(stats)
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break

        batch_valid_bool = batch_valid.bool()
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/intrinsic_reward", masked_mean(int_rewards, rollout_valid).item(), global_step)
        for name in minibatch_stats[0]:  # means over the update's minibatches
            writer.add_scalar(
                f"losses/{name}", torch.stack([s[name] for s in minibatch_stats]).mean().item(), global_step
            )
        writer.add_scalar(  # of the extrinsic value head, against the extrinsic returns
            "losses/explained_variance",
            metrics.explained_variance(batch_ext_values[batch_valid_bool], batch_ext_returns[batch_valid_bool]),
            global_step,
        )

        if measure:
            valid_index = torch.nonzero(batch_valid_bool).squeeze(1)
            sample = valid_index[torch.randperm(valid_index.numel(), device=device)[: args.metrics_batch]]
            measured = measure_agent(
                agent, batch_obs[sample], batch_actions[sample], batch_logits[sample], args.batch_size, args.dormant_tau
            )
            measured["grad_kurtosis"] = gradient_kurtosis
            measured["grad_norm"] = torch.stack(grad_norms).mean().item()
            for name, value in measured.items():
                writer.add_scalar(f"metrics/{name}", value, global_step)
            if args.save_embeddings:
                keep = sample[: args.embeddings_per_iteration]
                with torch.no_grad():
                    features, critic_features = agent.features(batch_obs[keep])
                    ext_values = agent.critic_ext(critic_features).squeeze(-1)
                    int_values = agent.critic_int(critic_features).squeeze(-1)
                embeddings["features"].append(features.cpu().numpy().astype(np.float16))
                embeddings["values"].append(ext_values.cpu().numpy())
                embeddings["int_values"].append(int_values.cpu().numpy())
                embeddings["iteration"].append(np.full(keep.numel(), iteration))
                embeddings["global_step"].append(np.full(keep.numel(), global_step))

        # After the metrics, so that SPS counts everything an iteration costs.
        writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
        completed_iteration = iteration
        progress.update(global_step, np.mean(recent_returns) if recent_returns else float("nan"))
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(checkpoint_path, agent, rnd, optimizer, normalisers(), args, iteration, global_step,
                            warmup_steps)  # fmt: skip
            if args.save_embeddings:
                save_embeddings(embeddings_path, embeddings)

    envs.close()
    if args.save_embeddings:
        save_embeddings(embeddings_path, embeddings)
    if stop_signal:
        save_checkpoint(checkpoint_path, agent, rnd, optimizer, normalisers(), args, completed_iteration, global_step,
                        warmup_steps)  # fmt: skip
        writer.close()
        print(
            f"\nstopped by signal {stop_signal[0]}: checkpoint at {checkpoint_path}; continue with --resume {checkpoint_path}"
        )
        sys.exit(128 + stop_signal[0])

    progress.update(global_step, np.mean(recent_returns) if recent_returns else float("nan"), final=True)
    if args.checkpoint_interval:
        save_checkpoint(checkpoint_path, agent, rnd, optimizer, normalisers(), args, completed_iteration, global_step,
                        warmup_steps)  # fmt: skip
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
