"""PPO on Procgen (EnvPool, gymnasium API) with the metrics of Mayor et al. (ICML 2025).

    python ppo_procgen.py --env-id BigfishEasy-v0 --num-envs 64 --num-steps 256

PPO with the IMPALA CNN (Espeholt et al. 2018) and the paper's Table 2 / reference
Procgen settings (Cobbe et al. 2020): easy mode, all levels, gamma 0.999, rewards scaled
by a running std of the discounted return and clipped to [-10, 10]. As in
ppo_atari_envpool.py:
- EnvPool's reset step (the step after an episode ends returns the next episode's first
  observation and ignores the action) is masked out of the losses, advantages, reward
  statistics and metrics; time-limit truncations bootstrap from the last observation.
- plasticity / optimisation metrics from `metrics.py` under `metrics/`, and the
  normalised return (`charts/normalized_return`, R_min/R_max from `metrics.py`);
- `--separate-networks`, `--minibatch-size` and `--lr-scaling` for the study's sweeps;
- atomic checkpoints (with the reward statistics), SIGTERM/SIGINT checkpointing, `--resume`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
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
    env_id: str = "BigfishEasy-v0"
    """EnvPool Procgen task id (easy mode: BigfishEasy-v0, StarpilotEasy-v0, ...)"""
    total_timesteps: int = 25_000_000
    """total environment steps (the paper's Procgen budget)"""
    num_envs: int = 64
    """N_envs: parallel environments"""
    num_steps: int = 256
    """N_RO: rollout length per environment and iteration"""
    num_levels: int = 0
    """distinct levels to train on (0: unlimited, the paper's setting; Cobbe et al.'s generalisation protocol uses 200)"""
    start_level: int = 0
    """first level seed: training uses levels start_level .. start_level + num_levels - 1"""

    # Optimisation
    learning_rate: float = 5e-4
    """Adam learning rate (before --lr-scaling)"""
    lr_scaling: Literal["none", "sqrt", "linear", "inverse"] = "none"
    """multiply the LR by sqrt(k), k or 1/k with k = num_envs / lr_reference_envs (paper Fig. 11)"""
    lr_reference_envs: int = 64
    """num_envs at which --lr-scaling leaves the LR unchanged"""
    anneal_lr: bool = False
    """anneal the LR linearly to 0 over training (the reference Procgen PPO keeps it constant)"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    gamma: float = 0.999
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    update_epochs: int = 3
    """epochs over each rollout"""
    num_minibatches: int = 8
    """minibatches per epoch (ignored when --minibatch-size is given)"""
    minibatch_size: int | None = None
    """fix the minibatch size instead; the number of minibatches is derived (Beukman et al. 2026)"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
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
    reward_clip: float = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""
    separate_networks: bool = False
    """actor and critic get their own IMPALA encoder (paper Fig. 5)"""

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


QT_HELP = (
    "EnvPool's Procgen needs the Qt 5 runtime (libQt5Core/libQt5Gui), which is not installed: "
    "run `sudo apt-get install -y libqt5gui5` (Debian/Ubuntu; `make setup` does it) or `dnf install qt5-qtbase`"
)


def check_procgen_runtime(env_id: str) -> None:
    """EnvPool loads Procgen's C++ library lazily; a missing Qt 5 shows up only here."""
    import envpool  # noqa: PLC0415

    try:
        envpool.make_spec(env_id)
    except ImportError as error:
        fail(QT_HELP if "qt" in str(error).lower() else f"EnvPool's Procgen cannot be loaded: {error}")


def validate_and_derive(args: Args) -> Args:
    """Check every flag before any environment exists; fill in the derived values."""
    import envpool  # noqa: PLC0415 - imported here so --help stays fast

    for name in ("total_timesteps", "num_envs", "num_steps", "update_epochs", "num_minibatches", "lr_reference_envs",
                 "metrics_batch", "embeddings_per_iteration"):  # fmt: skip
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("checkpoint_interval", "metrics_interval", "ent_coef", "vf_coef", "dormant_tau", "num_levels",
                 "start_level"):  # fmt: skip
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("learning_rate", "adam_eps", "clip_coef", "max_grad_norm", "reward_clip"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("gamma", "gae_lambda"):
        if not 0 <= getattr(args, name) <= 1:
            fail(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be > 0, got {args.target_kl}")
    procgen_ids = [env_id for env_id in envpool.list_all_envs() if env_id.endswith(("Easy-v0", "Hard-v0"))]
    if args.env_id not in procgen_ids:
        fail(f"--env-id {args.env_id!r} is not an EnvPool Procgen task (e.g. BigfishEasy-v0, StarpilotEasy-v0)")
    check_procgen_runtime(args.env_id)
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


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convolutions that keep the shape."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, activations: list[torch.Tensor] | None = None) -> torch.Tensor:
        hidden = torch.relu(x)
        inner = torch.relu(self.conv0(hidden))
        if activations is not None:
            activations += [hidden, inner]
        return x + self.conv1(inner)


class ConvSequence(nn.Module):
    """IMPALA stage: 3x3 convolution, 3x3 max-pool with stride 2, two residual blocks."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.residual0 = ResidualBlock(out_channels)
        self.residual1 = ResidualBlock(out_channels)

    def forward(self, x: torch.Tensor, activations: list[torch.Tensor] | None = None) -> torch.Tensor:
        x = self.pool(self.conv(x))
        return self.residual1(self.residual0(x, activations), activations)


class ImpalaEncoder(nn.Module):
    """Espeholt et al. 2018 encoder: stages of 16, 32, 32 channels and a 256-unit dense layer.

    A 64x64 frame is halved by each stage's pooling: 64 -> 32 -> 16 -> 8.
    """

    def __init__(self, in_channels: int = 3, channels: tuple[int, ...] = (16, 32, 32), hidden: int = 256):
        super().__init__()
        stages, previous = [], in_channels
        for out_channels in channels:
            stages.append(ConvSequence(previous, out_channels))
            previous = out_channels
        self.stages = nn.ModuleList(stages)
        self.dense = layer_init(nn.Linear(previous * 8 * 8, hidden))

    def forward(self, x: torch.Tensor, activations: list[torch.Tensor] | None = None) -> torch.Tensor:
        """`activations`, if given, receives every hidden post-ReLU output (for the dormant metric)."""
        for stage in self.stages:
            x = stage(x, activations)
        x = torch.relu(x)
        features = torch.relu(self.dense(x.flatten(1)))
        if activations is not None:
            activations += [x, features]
        return features


class Agent(nn.Module):
    def __init__(self, num_actions: int, separate_networks: bool):
        super().__init__()
        self.actor_encoder = ImpalaEncoder()
        self.critic_encoder = ImpalaEncoder() if separate_networks else None
        self.actor = layer_init(nn.Linear(256, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(256, 1), std=1)

    def features(self, obs: torch.Tensor, activations: list[torch.Tensor] | None = None):
        """Penultimate features (actor, critic); uint8 pixels are scaled here."""
        # channels_last: about 1.5x faster convolutions on the CPU (oneDNN), neutral on the GPU.
        x = (obs.float() / 255.0).contiguous(memory_format=torch.channels_last)
        actor_features = self.actor_encoder(x, activations)
        if self.critic_encoder is None:
            return actor_features, actor_features
        return actor_features, self.critic_encoder(x, activations)

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


def merge_moments(
    mean: torch.Tensor,
    var: torch.Tensor,
    count: torch.Tensor,
    batch_mean: torch.Tensor,
    batch_var: torch.Tensor,
    batch_count: torch.Tensor | float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chan et al.'s parallel update: moments of two sets from the moments of each.

    `var` and `batch_var` are population variances (divide by the count).
    """
    total = count + batch_count
    delta = batch_mean - mean
    new_mean = mean + delta * (batch_count / total)
    sum_of_squares = var * count + batch_var * batch_count + delta.square() * (count * batch_count / total)
    return new_mean, sum_of_squares / total, total


class RunningMeanStd:
    """Running mean and variance of a stream of (B, *shape) batches, kept on the training device.

    The count starts at 1e-4 with variance 1 (as OpenAI baselines' VecNormalize), so the
    first scaled rewards are not divided by a zero variance.
    """

    def __init__(self, shape: tuple[int, ...] = (), device: torch.device | str = "cpu"):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.full((), 1e-4, dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(self, batch: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Merge a batch; rows with weight 0 (reset steps) are left out without a host sync."""
        batch = batch.double()
        if weights is None:
            weights = torch.ones(batch.shape[0], dtype=torch.float64, device=batch.device)
        weights = weights.double().reshape((-1,) + (1,) * (batch.dim() - 1))
        batch_count = weights.sum()
        batch_mean = (weights * batch).sum(0) / batch_count.clamp(min=1.0)
        batch_var = (weights * (batch - batch_mean).square()).sum(0) / batch_count.clamp(min=1.0)
        self.mean, self.var, self.count = merge_moments(
            self.mean, self.var, self.count, batch_mean, batch_var, batch_count
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean.cpu(), "var": self.var.cpu(), "count": self.count.cpu()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        device = self.mean.device
        self.mean, self.var, self.count = (state[key].to(device, torch.float64) for key in ("mean", "var", "count"))


def scale_rewards(
    rewards: torch.Tensor,
    valid: torch.Tensor,
    dones: torch.Tensor,
    discounted_return: torch.Tensor,
    return_rms: RunningMeanStd,
    gamma: float,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward normalisation of the reference Procgen PPO (baselines' VecNormalize, returns only).

    For one step of N envs: the discounted return R <- gamma R + r feeds a running variance,
    the reward is divided by its std and clipped to [-clip, clip], and R restarts where an
    episode ended. Reset steps (valid = 0) are left out of the statistics.
    Returns (scaled rewards, the updated discounted return).
    """
    discounted_return = discounted_return * gamma + rewards
    return_rms.update(discounted_return, valid)
    scaled = (rewards / (return_rms.var.float() + 1e-8).sqrt()).clamp(-clip, clip)
    return scaled, discounted_return * (1.0 - dones)


def ppo_loss(
    new_logprob: torch.Tensor,
    old_logprob: torch.Tensor,
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
    norm_adv: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO objective over one minibatch; entries with mask 0 do not count."""
    if norm_adv:
        mean = masked_mean(advantages, mask)
        std = masked_mean((advantages - mean).square(), mask).sqrt()
        advantages = (advantages - mean) / (std + 1e-8)
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    policy_loss = masked_mean(
        torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)), mask
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
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy_loss.detach(),
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
    return values


# --------------------------------------------------------------------------------------
# Run directory, checkpoints, video
# --------------------------------------------------------------------------------------


def save_checkpoint(
    path: str,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    return_rms: RunningMeanStd,
    args: Args,
    iteration: int,
    global_step: int,
):
    """Write atomically: a crash while saving leaves the previous checkpoint intact."""
    state = {
        "model": agent.state_dict(),
        "return_rms": return_rms.state_dict(),
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
    """Play one episode of the final policy in a fresh EnvPool env; write its frames (x4) as an MP4."""
    import envpool  # noqa: PLC0415
    from moviepy import ImageSequenceClip  # noqa: PLC0415 - only needed for the video

    env = envpool.make(args.env_id, env_type="gymnasium", num_envs=1, seed=args.seed + 1_000_000,
                       num_levels=args.num_levels, start_level=args.start_level)  # fmt: skip
    obs, _ = env.reset()
    frames, total_return = [obs[0]], 0.0
    while True:
        with torch.inference_mode():
            action = agent.get_action_and_value(torch.as_tensor(obs, device=device))[0]
        obs, reward, terminated, truncated, _ = env.step(action.cpu().numpy())
        total_return += float(reward[0])
        if terminated[0] or truncated[0]:
            break
        frames.append(obs[0])
    env.close()
    video_dir = os.path.join(run_dir, "videos")
    os.makedirs(video_dir, exist_ok=True)
    path = os.path.join(video_dir, "eval-episode-0.mp4")
    # (3, 64, 64) frames -> (256, 256, 3): Procgen's native resolution is too small to watch.
    images = [frame.transpose(1, 2, 0).repeat(4, axis=0).repeat(4, axis=1) for frame in frames]
    ImageSequenceClip(images, fps=15).write_videofile(path, logger=None, audio=False)
    print(f"video of one evaluation episode (return {total_return:g}): {path}")
    return path


def keep_freed_memory_on_cpu() -> None:
    """Stop glibc from unmapping large freed blocks (CPU training only).

    Each minibatch allocates and frees activations of tens of MB; by default glibc returns
    them to the OS and the next minibatch page-faults them in again, which doubled the CPU
    time of an update here. A 1 GiB mmap threshold keeps them in the heap for reuse.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 2**30)  # M_MMAP_THRESHOLD


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
            or not {"args", "model", "optimizer", "return_rms", "iteration", "rng"} <= checkpoint.keys()
            or not isinstance(checkpoint["args"], dict)
            or not checkpoint["args"].keys() <= {field.name for field in fields(Args)}  # another script's run
        ):
            fail(f"--resume {args.resume!r} is not a checkpoint.pt of ppo_procgen.py")
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
    if device.type == "cpu":
        keep_freed_memory_on_cpu()

    import envpool  # noqa: PLC0415

    start_iteration, global_step = 1, 0
    if checkpoint is not None:
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]
    # A resumed run starts fresh episodes from a different env seed (EnvPool state is not saved).
    # Distribution mode from the id (Easy/Hard), each game's own time limit (EnvPool's
    # Procgen ignores max_episode_steps).
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=args.seed + start_iteration - 1,
                        num_levels=args.num_levels, start_level=args.start_level)  # fmt: skip
    num_actions = envs.action_space.n

    agent = Agent(num_actions, args.separate_networks).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.scaled_learning_rate, eps=args.adam_eps)
    return_rms = RunningMeanStd(device=device)
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        return_rms.load_state_dict(checkpoint["return_rms"])
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
    discounted_return = torch.zeros(args.num_envs, device=device)  # for the reward scaling
    episode_return = np.zeros(args.num_envs)
    try:
        metrics.procgen_normalized_score(args.env_id, 0.0)
        normalise_return = True
    except KeyError:
        normalise_return = False
        print(f"notice: no easy-mode return range for {args.env_id}; charts/normalized_return is not logged")
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
            rollout_terminations[step] = torch.as_tensor(terminations, device=device)
            rollout_truncations[step] = torch.as_tensor(truncations, device=device)
            next_done = torch.maximum(rollout_terminations[step], rollout_truncations[step])
            rollout_rewards[step], discounted_return = scale_rewards(
                torch.as_tensor(reward, device=device, dtype=torch.float32), rollout_valid[step], next_done,
                discounted_return, return_rms, args.gamma, args.reward_clip,
            )  # fmt: skip

            episode_return += reward  # raw reward; 0 on reset steps
            episode_over = terminations | truncations
            if episode_over.any():
                for finished_return, finished_length in zip(
                    episode_return[episode_over], info["elapsed_step"][episode_over], strict=True
                ):
                    writer.add_scalar("charts/episodic_return", finished_return, global_step)
                    writer.add_scalar("charts/episodic_length", finished_length, global_step)
                    if normalise_return:
                        normalized = metrics.procgen_normalized_score(args.env_id, finished_return)
                        writer.add_scalar("charts/normalized_return", normalized, global_step)
                    recent_returns.append(float(finished_return))
                episode_return[episode_over] = 0.0
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
                loss, stats = ppo_loss(new_logprob, batch_logprobs[mb], batch_advantages[mb], new_value, batch_values[mb],
                                       batch_returns[mb], entropy, batch_valid[mb], args.clip_coef, args.clip_vloss,
                                       args.ent_coef, args.vf_coef, args.norm_adv)  # fmt: skip
                optimizer.zero_grad()
                loss.backward()
                if measure and gradient_kurtosis is None:
                    gradient_kurtosis = metrics.gradient_kurtosis(
                        p.grad for p in agent.parameters() if p.grad is not None
                    )
                grad_norms.append(nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm))
                optimizer.step()
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
            save_checkpoint(checkpoint_path, agent, optimizer, return_rms, args, iteration, global_step)
            if args.save_embeddings:
                save_embeddings(embeddings_path, embeddings)

    envs.close()
    if args.save_embeddings:
        save_embeddings(embeddings_path, embeddings)
    if stop_signal:
        save_checkpoint(checkpoint_path, agent, optimizer, return_rms, args, completed_iteration, global_step)
        writer.close()
        print(
            f"\nstopped by signal {stop_signal[0]}: checkpoint at {checkpoint_path}; continue with --resume {checkpoint_path}"
        )
        sys.exit(128 + stop_signal[0])

    progress.update(global_step, np.mean(recent_returns) if recent_returns else float("nan"), final=True)
    if args.checkpoint_interval:
        save_checkpoint(checkpoint_path, agent, optimizer, return_rms, args, completed_iteration, global_step)
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
