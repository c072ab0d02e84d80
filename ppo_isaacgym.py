"""Continuous-action PPO (Isaac Gym or EnvPool MuJoCo) with the metrics of Mayor et al. (ICML 2025).

    python ppo_isaacgym.py --env-id Ant                         # Isaac Gym if installed, else EnvPool's Ant-v5
    python ppo_isaacgym.py --backend envpool --env-id Hopper-v5 --num-envs 64 --num-steps 64

PPO with a Gaussian policy (state-independent log-std; sampled actions are clipped to the
action bounds, no tanh squashing) and the reference Isaac Gym settings of CleanRL's
ppo_continuous_action_isaacgym.py: 4096 envs x 16 steps, 4 epochs, 2 minibatches,
lr 0.0026, clip 0.2, no entropy bonus, max grad norm 1. Observations and rewards are
normalised by running statistics kept on the training device and saved in checkpoints.
As in the Atari scripts:
- the step after an episode ends is a reset step (EnvPool returns the next episode's first
  observation; Isaac Gym's tasks reset at the start of the next step too) and is masked
  out of the losses, advantages, reward statistics and metrics; time-limit truncations
  bootstrap from the value of the last observation;
- the metrics of `metrics.py` under `metrics/`, with the Gaussian definitions (policy
  variance over means and stds, exact Gaussian KL for DDR);
- `--separate-networks`, `--minibatch-size`, `--lr-scaling`; atomic checkpoints,
  SIGTERM/SIGINT checkpointing and `--resume`.
"""

from __future__ import annotations

import importlib.util

# Isaac Gym refuses to load once torch is imported (it checks sys.modules), so its core
# module is imported first when it is installed; the tasks (isaacgymenvs) load lazily.
if importlib.util.find_spec("isaacgym") is not None:
    import isaacgym  # noqa: F401

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
from torch.distributions import Normal

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
    runs_dir: str = "runs"
    """folder that holds the run directories"""
    save_model: bool = False
    """save the final model and normalisers to runs/.../{exp_name}.cleanrl_model"""
    checkpoint_interval: int = 0
    """write runs/.../checkpoint.pt every this many iterations (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from (its run's flags are used)"""

    # Environment
    env_id: str = "Ant"
    """task: an Isaac Gym task (Ant, Humanoid, Anymal, ShadowHand, ...) or an EnvPool MuJoCo id (Ant-v5, Hopper-v5, ...)"""
    backend: Literal["auto", "isaacgym", "envpool"] = "auto"
    """simulator: auto = Isaac Gym when it is installed and --env-id is not an EnvPool id; Ant/Humanoid map to Ant-v5/Humanoid-v5 on EnvPool"""
    total_timesteps: int = 30_000_000
    """total environment steps"""
    max_episode_steps: int | None = None
    """EnvPool only: time limit in agent steps (default: the task's own, 1000 for the MuJoCo tasks)"""
    num_envs: int = 4096
    """N_envs: parallel environments"""
    num_steps: int = 16
    """N_RO: rollout length per environment and iteration"""

    # Optimisation
    learning_rate: float = 0.0026
    """Adam learning rate (before --lr-scaling)"""
    lr_scaling: Literal["none", "sqrt", "linear", "inverse"] = "none"
    """multiply the LR by sqrt(k), k or 1/k with k = num_envs / lr_reference_envs (paper Fig. 11)"""
    lr_reference_envs: int = 4096
    """num_envs at which --lr-scaling leaves the LR unchanged"""
    anneal_lr: bool = False
    """anneal the LR linearly to 0 over training"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    update_epochs: int = 4
    """epochs over each rollout"""
    num_minibatches: int = 2
    """minibatches per epoch (ignored when --minibatch-size is given)"""
    minibatch_size: int | None = None
    """fix the minibatch size instead; the number of minibatches is derived (Beukman et al. 2026)"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
    """PPO surrogate clipping epsilon"""
    clip_vloss: bool = False
    """clip the value loss around the old values"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 2.0
    """value loss coefficient"""
    max_grad_norm: float = 1.0
    """global gradient norm clipping"""
    target_kl: float | None = None
    """stop the epochs early when approx KL exceeds this"""
    obs_clip: float = 10.0
    """normalised observations are clipped to [-obs_clip, obs_clip]"""
    reward_clip: float = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""
    separate_networks: bool = True
    """actor and critic MLPs share no layers (the reference); --no-separate-networks shares the hidden layers (paper Fig. 5)"""

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
RUNTIME_FLAGS = ("cuda", "track", "wandb_project_name", "wandb_entity", "save_model", "checkpoint_interval", "resume")

# Isaac Gym task -> its EnvPool MuJoCo counterpart (and back), so one sweep runs on either.
ENVPOOL_COUNTERPART = {"Ant": "Ant-v5", "Humanoid": "Humanoid-v5"}
ISAACGYM_COUNTERPART = {envpool_id: task for task, envpool_id in ENVPOOL_COUNTERPART.items()}
ISAACGYM_HELP = (
    "Isaac Gym is not installed (it is not on PyPI): download Isaac Gym Preview 4 from "
    "https://developer.nvidia.com/isaac-gym, `pip install -e isaacgym/python`, then `pip install -e .` in a clone of "
    "https://github.com/isaac-sim/IsaacGymEnvs; or run the MuJoCo counterpart with --backend envpool"
)


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


def isaacgym_installed() -> bool:
    return importlib.util.find_spec("isaacgym") is not None and importlib.util.find_spec("isaacgymenvs") is not None


def is_envpool_mujoco(env_id: str) -> bool:
    """EnvPool's gymnasium MuJoCo tasks with flat observations (Ant-v5, Hopper-v5, ...), not dm_control's."""
    import envpool  # noqa: PLC0415

    if env_id not in envpool.list_all_envs():
        return False
    spec = envpool.make_spec(env_id)
    flat_observations = len(getattr(spec.observation_space, "shape", None) or ()) == 1  # not the goal-dict tasks
    continuous_actions = spec.action_space.dtype.kind == "f"
    return type(spec).__name__.startswith("Gym") and flat_observations and continuous_actions  # dm_control: Dmc...


def resolve_backend(args: Args) -> None:
    """Pick the simulator for --backend and map --env-id to that simulator's name for the task."""
    if args.backend == "auto":
        explicit_envpool_id = args.env_id in ISAACGYM_COUNTERPART or "-v" in args.env_id
        args.backend = "isaacgym" if isaacgym_installed() and not explicit_envpool_id else "envpool"
    if args.backend == "isaacgym":
        if not isaacgym_installed():
            fail(f"--backend isaacgym: {ISAACGYM_HELP}")
        from isaacgymenvs.tasks import isaacgym_task_map  # noqa: PLC0415 - only with Isaac Gym

        args.env_id = ISAACGYM_COUNTERPART.get(args.env_id, args.env_id)
        if args.env_id not in isaacgym_task_map:
            fail(f"--env-id {args.env_id!r} is not an Isaac Gym task (known: {', '.join(sorted(isaacgym_task_map))})")
        if args.max_episode_steps is not None:
            fail("--max-episode-steps applies to --backend envpool only (Isaac Gym tasks set their own episode length)")
    else:
        args.env_id = ENVPOOL_COUNTERPART.get(args.env_id, args.env_id)
        if not is_envpool_mujoco(args.env_id):
            fail(
                f"--env-id {args.env_id!r} is not an EnvPool MuJoCo task (e.g. Ant-v5, Humanoid-v5, HalfCheetah-v5, "
                "Hopper-v5, Walker2d-v5)"
                + ("" if isaacgym_installed() else "; Isaac Gym tasks need Isaac Gym installed")
            )


def validate_and_derive(args: Args) -> Args:
    """Check every flag before any environment exists; fill in the derived values."""
    for name in ("total_timesteps", "num_envs", "num_steps", "update_epochs", "num_minibatches", "lr_reference_envs",
                 "metrics_batch", "embeddings_per_iteration"):  # fmt: skip
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.max_episode_steps is not None and args.max_episode_steps <= 0:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    for name in ("checkpoint_interval", "metrics_interval", "ent_coef", "vf_coef", "dormant_tau"):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("learning_rate", "adam_eps", "clip_coef", "max_grad_norm", "obs_clip", "reward_clip"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("gamma", "gae_lambda"):
        if not 0 <= getattr(args, name) <= 1:
            fail(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be > 0, got {args.target_kl}")
    resolve_backend(args)

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
# Environments: two simulators behind the same three members (torch tensors in and out)
# --------------------------------------------------------------------------------------


class EnvPoolTasks:
    """EnvPool MuJoCo tasks on the CPU; observations and rewards are moved to the training device."""

    def __init__(self, env_id: str, num_envs: int, seed: int, max_episode_steps: int | None, device: torch.device):
        import envpool  # noqa: PLC0415

        time_limit = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        self.envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **time_limit)
        self.device = device
        self.observation_shape = self.envs.observation_space.shape
        self.action_low = torch.as_tensor(self.envs.action_space.low, dtype=torch.float32, device=device)
        self.action_high = torch.as_tensor(self.envs.action_space.high, dtype=torch.float32, device=device)

    def reset(self) -> torch.Tensor:
        obs, _ = self.envs.reset()
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(next obs, reward, terminated, truncated) as float32 tensors on the device."""
        obs, reward, terminated, truncated, _ = self.envs.step(actions.cpu().numpy())
        as_tensor = lambda x: torch.as_tensor(x, dtype=torch.float32, device=self.device)  # noqa: E731
        return as_tensor(obs), as_tensor(reward), as_tensor(terminated), as_tensor(truncated)

    def close(self) -> None:
        self.envs.close()


class IsaacGymTasks:
    """IsaacGymEnvs tasks: observations and rewards stay CUDA tensors (untested on this project's CI)."""

    def __init__(self, task: str, num_envs: int, seed: int, device: torch.device):
        import isaacgymenvs  # noqa: PLC0415 - only with Isaac Gym

        cuda = device.type == "cuda"
        self.envs = isaacgymenvs.make(seed=seed, task=task, num_envs=num_envs, sim_device=str(device) if cuda else "cpu",
                                      rl_device=str(device), graphics_device_id=0 if cuda else -1, headless=True)  # fmt: skip
        self.observation_shape = self.envs.observation_space.shape
        self.action_low = torch.as_tensor(self.envs.action_space.low, dtype=torch.float32, device=device)
        self.action_high = torch.as_tensor(self.envs.action_space.high, dtype=torch.float32, device=device)

    def reset(self) -> torch.Tensor:
        return self.envs.reset()["obs"].float()

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        obs, reward, dones, extras = self.envs.step(actions)
        truncated = extras["time_outs"].float()  # time-limit resets; the other dones are terminations
        return obs["obs"].float(), reward.float(), dones.float() * (1.0 - truncated), truncated

    def close(self) -> None:
        pass  # Isaac Gym frees its simulation at exit


# --------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp_encoder(input_dim: int, hidden: int = 256, layers: int = 3) -> nn.Sequential:
    """Tanh MLP of the reference Isaac Gym PPO (3 x 256); its last output is the penultimate feature."""
    modules: list[nn.Module] = []
    for index in range(layers):
        modules += [layer_init(nn.Linear(input_dim if index == 0 else hidden, hidden)), nn.Tanh()]
    return nn.Sequential(*modules)


def run_encoder(encoder: nn.Sequential, x: torch.Tensor, activations: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Apply the encoder; if a list is given, append every hidden post-activation output to it."""
    for layer in encoder:
        x = layer(x)
        if activations is not None and isinstance(layer, nn.Tanh):
            activations.append(x)
    return x


class Agent(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, separate_networks: bool):
        super().__init__()
        self.actor_encoder = mlp_encoder(obs_dim)
        self.critic_encoder = mlp_encoder(obs_dim) if separate_networks else None
        self.actor_mean = layer_init(nn.Linear(256, action_dim), std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))  # state-independent
        self.critic = layer_init(nn.Linear(256, 1), std=1.0)

    def features(self, obs: torch.Tensor, activations: list[torch.Tensor] | None = None):
        """Penultimate features (actor, critic) of normalised observations."""
        actor_features = run_encoder(self.actor_encoder, obs, activations)
        if self.critic_encoder is None:
            return actor_features, actor_features
        return actor_features, run_encoder(self.critic_encoder, obs, activations)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)[1]).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Unclipped action, its log-probability and entropy (summed over dimensions), value, mean."""
        actor_features, critic_features = self.features(obs)
        mean = self.actor_mean(actor_features)
        distribution = Normal(mean, self.actor_logstd.exp().expand_as(mean))
        if action is None:
            action = distribution.sample()
        value = self.critic(critic_features).squeeze(-1)
        return action, distribution.log_prob(action).sum(-1), distribution.entropy().sum(-1), value, mean


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
    """Reward normalisation as in baselines' VecNormalize (returns only), used by the reference PPOs.

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


def normalise_observations(obs: torch.Tensor, obs_rms: RunningMeanStd, clip: float) -> torch.Tensor:
    """Update the running statistics with raw observations, then (obs - mean) / std clipped to +-clip.

    Every observation is a real state (first observations after a reset too), so all count.
    """
    obs_rms.update(obs)
    return ((obs - obs_rms.mean.float()) / (obs_rms.var.float() + 1e-8).sqrt()).clamp(-clip, clip)


@torch.no_grad()
def measure_agent(
    agent: Agent,
    obs: torch.Tensor,
    actions: torch.Tensor,
    behavior_mean: torch.Tensor,
    behavior_std: torch.Tensor,
    batch_size: int,
    dormant_tau: float,
) -> dict[str, float]:
    """The metrics/ tags that need a forward pass, on the states of the metrics batch.

    Called after the update: ratios and the exact Gaussian KL compare the updated policy
    with the policy that collected the rollout (the behaviour policy, mean and std per
    state). DDR divides the training batch size by that KL.
    """
    activations: list[torch.Tensor] = []
    actor_features, critic_features = agent.features(obs, activations)
    mean = agent.actor_mean(actor_features)
    std = agent.actor_logstd.exp().expand_as(mean)
    new_logprob = Normal(mean, std).log_prob(actions).sum(-1)
    behavior_logprob = Normal(behavior_mean, behavior_std).log_prob(actions).sum(-1)
    kl_behavior = metrics.gaussian_kl(behavior_mean, behavior_std, mean, std).mean().item()
    values = {
        "feature_rank": metrics.feature_rank(actor_features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_tau),
        "weight_norm": metrics.weight_norm(agent.parameters()),
        "ess_pct": metrics.ess_percentage((new_logprob - behavior_logprob).exp()),
        "policy_variance": metrics.gaussian_policy_variance(mean, std),
        "kl_behavior": kl_behavior,
        "ddr": metrics.data_to_divergence_ratio(batch_size, kl_behavior),
    }
    if agent.critic_encoder is not None:
        values["feature_rank_critic"] = metrics.feature_rank(critic_features)
    return values


# --------------------------------------------------------------------------------------
# Run directory and checkpoints
# --------------------------------------------------------------------------------------


def save_checkpoint(
    path: str,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    normalisers: dict[str, RunningMeanStd],
    args: Args,
    iteration: int,
    global_step: int,
):
    """Write atomically: a crash while saving leaves the previous checkpoint intact."""
    state = {
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "normalisers": {name: normaliser.state_dict() for name, normaliser in normalisers.items()},
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
            or not {"args", "model", "optimizer", "normalisers", "iteration", "rng"} <= checkpoint.keys()
            or not isinstance(checkpoint["args"], dict)
            or not checkpoint["args"].keys() <= {field.name for field in fields(Args)}  # another script's run
        ):
            fail(f"--resume {args.resume!r} is not a checkpoint.pt of ppo_isaacgym.py")
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

    start_iteration, global_step = 1, 0
    if checkpoint is not None:
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]
    # A resumed run starts fresh episodes from a different env seed (simulator state is not saved).
    env_seed = args.seed + start_iteration - 1
    if args.backend == "isaacgym":
        envs = IsaacGymTasks(args.env_id, args.num_envs, env_seed, device)
    else:
        envs = EnvPoolTasks(args.env_id, args.num_envs, env_seed, args.max_episode_steps, device)
    (obs_dim,), action_dim = envs.observation_shape, envs.action_low.numel()

    agent = Agent(obs_dim, action_dim, args.separate_networks).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.scaled_learning_rate, eps=args.adam_eps)
    normalisers = {"obs": RunningMeanStd((obs_dim,), device), "return": RunningMeanStd((), device)}
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        for name, normaliser in normalisers.items():
            normaliser.load_state_dict(checkpoint["normalisers"][name])
        restore_rng(checkpoint["rng"])
        print(f"resumed {run_dir} at iteration {start_iteration} (global step {global_step:,})")

    embeddings_path = os.path.join(run_dir, "embeddings.npz")
    embeddings: dict[str, list[np.ndarray]] = {"features": [], "values": [], "iteration": [], "global_step": []}
    if args.save_embeddings and os.path.exists(embeddings_path):
        with np.load(embeddings_path) as saved_embeddings:
            for key, chunks in embeddings.items():
                chunks.append(saved_embeddings[key])

    # Rollout storage on the training device (normalised observations, unclipped actions).
    rollout_shape = (args.num_steps, args.num_envs)
    rollout_obs = torch.zeros(rollout_shape + (obs_dim,), device=device)
    rollout_actions = torch.zeros(rollout_shape + (action_dim,), device=device)
    rollout_logprobs = torch.zeros(rollout_shape, device=device)
    rollout_means = torch.zeros(rollout_shape + (action_dim,), device=device)
    rollout_rewards = torch.zeros(rollout_shape, device=device)
    rollout_terminations = torch.zeros(rollout_shape, device=device)
    rollout_truncations = torch.zeros(rollout_shape, device=device)
    rollout_valid = torch.zeros(rollout_shape, device=device)
    rollout_values = torch.zeros(rollout_shape, device=device)
    # Finished episodes, read back once per iteration instead of once per step.
    rollout_finished_returns = torch.zeros(rollout_shape, device=device)
    rollout_finished_lengths = torch.zeros(rollout_shape, device=device)

    # SIGTERM (Slurm pre-emption, kill) and SIGINT (Ctrl-C) ask for a checkpoint and a clean exit.
    stop_signal: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))

    next_obs = normalise_observations(envs.reset(), normalisers["obs"], args.obs_clip)
    next_done = torch.zeros(args.num_envs, device=device)
    discounted_return = torch.zeros(args.num_envs, device=device)  # for the reward scaling
    episode_return = torch.zeros(args.num_envs, device=device)
    episode_length = torch.zeros(args.num_envs, device=device)
    recent_returns: deque[float] = deque(maxlen=20)
    progress = Progress(args.total_timesteps, global_step)
    completed_iteration = start_iteration - 1
    start_time, start_step = time.time(), global_step

    for iteration in range(start_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (
                1.0 - (iteration - 1.0) / args.num_iterations
            ) * args.scaled_learning_rate
        behavior_std = agent.actor_logstd.detach().exp().clone()  # fixed during the rollout
        iteration_start_step = global_step

        for step in range(args.num_steps):
            if stop_signal:
                break
            global_step += args.num_envs
            rollout_obs[step] = next_obs
            rollout_valid[step] = reset_step_mask(next_done)
            with torch.inference_mode():
                action, logprob, _, value, mean = agent.get_action_and_value(next_obs)
            rollout_values[step] = value
            rollout_actions[step] = action
            rollout_logprobs[step] = logprob
            rollout_means[step] = mean

            raw_obs, reward, rollout_terminations[step], rollout_truncations[step] = envs.step(
                action.clamp(envs.action_low, envs.action_high)
            )
            next_obs = normalise_observations(raw_obs, normalisers["obs"], args.obs_clip)
            next_done = torch.maximum(rollout_terminations[step], rollout_truncations[step])
            rollout_rewards[step], discounted_return = scale_rewards(reward, rollout_valid[step], next_done,
                                                                     discounted_return, normalisers["return"],
                                                                     args.gamma, args.reward_clip)  # fmt: skip

            # Raw return and length of real transitions only (Isaac Gym's reset step has a reward).
            episode_return += reward * rollout_valid[step]
            episode_length += rollout_valid[step]
            rollout_finished_returns[step] = episode_return * next_done
            rollout_finished_lengths[step] = episode_length * next_done
            episode_return *= 1.0 - next_done
            episode_length *= 1.0 - next_done
        if stop_signal:
            global_step -= step * args.num_envs  # the interrupted rollout is discarded
            break

        finished = torch.maximum(rollout_terminations, rollout_truncations).bool()
        steps_done, _ = finished.nonzero(as_tuple=True)  # row-major, the order of the boolean indexing below
        for t, finished_return, finished_length in zip(steps_done.tolist(), rollout_finished_returns[finished].tolist(),
                                                       rollout_finished_lengths[finished].tolist(), strict=True):  # fmt: skip
            step_of_episode_end = iteration_start_step + (t + 1) * args.num_envs
            writer.add_scalar("charts/episodic_return", finished_return, step_of_episode_end)
            writer.add_scalar("charts/episodic_length", finished_length, step_of_episode_end)
            recent_returns.append(finished_return)

        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            advantages, returns = compute_gae(rollout_rewards, rollout_values, rollout_terminations, rollout_truncations,
                                              rollout_valid, next_value, args.gamma, args.gae_lambda)  # fmt: skip

        batch_obs = rollout_obs.reshape(-1, obs_dim)
        batch_actions = rollout_actions.reshape(-1, action_dim)
        batch_logprobs = rollout_logprobs.reshape(-1)
        batch_means = rollout_means.reshape(-1, action_dim)
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
            measured = measure_agent(agent, batch_obs[sample], batch_actions[sample], batch_means[sample],
                                     behavior_std.expand(sample.numel(), -1), args.batch_size,
                                     args.dormant_tau)  # fmt: skip
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
            save_checkpoint(checkpoint_path, agent, optimizer, normalisers, args, iteration, global_step)
            if args.save_embeddings:
                save_embeddings(embeddings_path, embeddings)

    envs.close()
    if args.save_embeddings:
        save_embeddings(embeddings_path, embeddings)
    if stop_signal:
        save_checkpoint(checkpoint_path, agent, optimizer, normalisers, args, completed_iteration, global_step)
        writer.close()
        print(
            f"\nstopped by signal {stop_signal[0]}: checkpoint at {checkpoint_path}; continue with --resume {checkpoint_path}"
        )
        sys.exit(128 + stop_signal[0])

    progress.update(global_step, np.mean(recent_returns) if recent_returns else float("nan"), final=True)
    if args.checkpoint_interval:
        save_checkpoint(checkpoint_path, agent, optimizer, normalisers, args, completed_iteration, global_step)
    if args.save_model:
        # The policy acts on normalised observations: the statistics belong with the weights.
        model_path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        model = {"model": agent.state_dict(), "obs_rms": normalisers["obs"].state_dict()}
        torch.save(model, f"{model_path}.tmp")
        os.replace(f"{model_path}.tmp", model_path)
        print(f"model saved to {model_path}")
    writer.close()
    # Completion marker: sweeps/launch.sh skips run directories that have one.
    with open(os.path.join(run_dir, "done.json"), "w") as f:
        json.dump({"global_step": global_step, "iterations": completed_iteration}, f)
    if args.track:
        wandb.finish()


if __name__ == "__main__":
    main()
