"""PPO and PPO-EWMA on Kinetix (Jax2D) with the metrics of Mayor et al. (ICML 2025) and Beukman et al. (2026).

    python ppo_kinetix.py                                    # 512 locomotion morphologies, PPO, Beukman's Table 2
    python ppo_kinetix.py --ewma-com 64                      # PPO-EWMA: the proximal policy an EWMA of the weights
    python ppo_kinetix.py --task-set handmade --env-size s   # Kinetix's hand-designed S levels
    python ppo_kinetix.py --task-set random --env-size m --num-tasks 4096   # a bank of random M levels

Beukman et al.'s own domain: the environments are JAX (Kinetix on the Jax2D engine, every environment of the batch
stepped in one compiled call), the policy is torch, and the two share the batch through DLPack on one device (the GPU
when there is one), with no copy. A task set (procedural locomotion morphologies, random levels, or hand-designed
levels) is generated once, stored with the run (tasks.npz) and sampled at every reset. The score is Kinetix's solve
rate: the fraction of the task set that the policy solves in its first episode. Two things differ from the EnvPool
scripts, both in `compute_gae` below: Kinetix resets in the step that ends an episode (no reset step to mask), and a
time-out is a truncation that bootstraps from the last state's value (`--bootstrap-timeouts`). Table 2's settings:
gamma 0.995, lambda 0.9, 2048 envs x 256 steps, 8 epochs, 32 minibatches, clip 0.2 with value clipping, Adam 3e-4, a
3-layer MLP of width 256 for the actor and one for the critic, a MultiDiscrete policy head; every metric of metrics.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX would take 75 % of the GPU's memory: torch's too
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # XLA's C++ warnings (on loading cached code, ...) on every start

import contextlib
import copy
import ctypes
import fcntl
import glob
import hashlib
import importlib.metadata
import importlib.util
import io
import itertools
import json
import math
import re
import shutil
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from functools import cache, partial
from types import ModuleType, SimpleNamespace
from typing import Annotated, Literal

import numpy as np
import torch
import torch.distributed as dist
import tyro
from torch import nn
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import metrics

try:  # Kinetix's engine; its absence is one line from validate_and_derive, not a traceback
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = jnp = None

# Set by torchrun in each of its processes; a plain run is process 0 of 1.
RANK, LOCAL_RANK = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
RUN_DIR = ""  # the run directory (process 0 opens it, torchrun's others learn its path), once start_run has opened it
ACTION_SIZES = (3, 3, 3, 3, 2, 2)  # Kinetix's MultiDiscrete actions: 4 motors (-, 0, +) and 2 thrusters (off, on)


@dataclass
class Args:
    # The study: tasks and data collection
    task_set: Literal["locomotion", "random", "handmade"] = "locomotion"
    """locomotion: --num-tasks procedural morphologies (Beukman et al.); random: a bank of --num-tasks random levels
    (those that no-op actions solve left out, as Kinetix's PPO does); handmade: Kinetix's hand-designed levels of
    --env-size (or --levels)"""
    env_size: Literal["s", "m", "l"] = "l"
    """Kinetix's size class: the most polygons, circles, joints and thrusters a level has (locomotion needs m or l)"""
    num_tasks: int = 512
    """locomotion and random: the number of tasks generated once (from --task-seed) and stored with the run"""
    task_seed: int = 0
    """seed of the task set's generation: the same set for every --seed"""
    levels: str | None = None
    """handmade: comma-separated level names (e.g. s/h0_weak_thrust.json,s/h4_thrust_aim.json); default: all of the size"""
    dense_reward_scale: float = 0.2
    """the dense shaping added to Kinetix's +-1: this x the decrease in the distance to the goal in a step (0: sparse);
    0.2 as in Kinetix's configs, which Beukman et al. use (0.1 is its EnvParams' default)"""
    seed: int = 1
    """seed of the experiment (torch and the environments)"""
    total_timesteps: int = 100_000_000
    """total environment steps"""
    num_envs: int = 2048
    """N_envs: parallel environments"""
    num_steps: int = 256
    """N_RO: rollout length per environment and iteration"""
    bootstrap_timeouts: bool = True
    """a time-out (Kinetix's 256-step limit) bootstraps from the last state's value; --no-bootstrap-timeouts: a
    terminal state, as Kinetix's own PPO treats it"""
    # The algorithm
    learning_rate: float = 3e-4
    """Adam learning rate (before --lr-scaling)"""
    lr_scaling: Literal["none", "sqrt", "linear", "inverse", "inverse-sqrt"] = "none"
    """multiply the LR by sqrt(k), k, 1/k or 1/sqrt(k), k = num_envs / lr_reference_envs (paper Fig. 11: up and down)"""
    lr_reference_envs: int = 2048
    """num_envs at which --lr-scaling leaves the LR unchanged"""
    anneal_lr: bool = False
    """anneal the LR linearly to 0 over training (Beukman Fig. 4 sweeps it)"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    gamma: float = 0.995
    """discount factor"""
    gae_lambda: float = 0.9
    """GAE lambda"""
    update_epochs: int = 8
    """epochs over each rollout"""
    num_minibatches: int = 32
    """minibatches per epoch (ignored when --minibatch-size is given)"""
    minibatch_size: int | None = None
    """fix the minibatch size instead; the number of minibatches is derived (Beukman et al. 2026)"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
    """PPO surrogate clipping epsilon (the first one, with --target-ddr); 0 is allowed: Beukman Fig. 6b"""
    ewma_com: float | None = None
    """PPO-EWMA: the proximal policy's EWMA centre of mass in optimizer steps, beta = com / (com + 1); absent: PPO"""
    importance_weight_cap: float = 100.0
    """PPO-EWMA: cap on the importance weight pi_prox / pi_behavior (Hilton et al. 2022 cap it at 100)"""
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
    target_ddr: float | None = None
    """adapt --clip-coef every iteration so that the DDR, batch / KL, tracks this (Beukman 2026)"""
    target_ddr_final: float | None = None
    """with --target-ddr: the target grows geometrically to this value by the end of training (Beukman: DDR must increase)"""
    adapt_rate: float = 0.1
    """with --target-ddr: clip_coef *= (DDR / target) ** adapt_rate after every iteration"""
    clip_coef_bounds: tuple[float, float] = (0.01, 0.5)
    """with --target-ddr: the adapted clip_coef stays in [low, high]"""
    ddr_batch: int = 512
    """with --target-ddr: states for the KL of the iterations without metrics (those use the metrics batch; at most it)"""
    separate_networks: bool = True
    """actor and critic get their own MLP (Beukman's PPO); --no-separate-networks shares the hidden layers (paper Fig. 5)"""
    activation: Literal["tanh", "relu"] = "tanh"
    """the hidden layers' activation"""
    # Evaluation: the solve rate
    eval_interval: int = 10
    """log charts/solve_rate on the training task set every this many iterations and at the end (0: at the end only)"""
    eval_attempts: int = 1
    """episodes per task in an evaluation, each from the task's start (the policy samples its actions)"""
    eval_handmade: bool = True
    """at the end, also charts/solve_rate_handmade on Kinetix's hand-designed levels of --env-size"""
    # Metrics
    metrics_interval: int = 10
    """compute the metrics/ tags every this many iterations and on the last (0: never; --target-ddr logs metrics/ddr always)"""
    metrics_batch: int = 2048
    """at most this many states of the rollout are used for the metrics (under torchrun, an equal share of each process's)"""
    dormant_definition: Literal["sokar", "absolute"] = "sokar"
    """dormant neurons: sokar, mean |h_i| / the layer's mean <= threshold (Sokar et al. 2023, whom the paper's B.2 follows);
    absolute, mean |h_i| < threshold (B.2's formula: only the units that are all but silent, e.g. dead ReLUs)"""
    dormant_threshold: Annotated[float | None, tyro.conf.arg(aliases=("--dormant-tau",))] = None
    """the dormant test's threshold (default: 0.025 for sokar, Sokar's tau; 1e-5 for absolute, B.2's epsilon)"""
    save_embeddings: bool = False
    """on metrics iterations save penultimate features and values to runs/.../embeddings.npz"""
    embeddings_per_iteration: int = 256
    """states saved per metrics iteration with --save-embeddings"""
    # Run, logging and checkpoints
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    runs_dir: str = "runs"
    """folder that holds the run directories"""
    track: bool = False
    """also log to Weights & Biases (TensorBoard is always written; WANDB_MODE=offline works)"""
    wandb_project_name: str = "parallel-data-collection"
    """the Weights & Biases project"""
    wandb_entity: str | None = None
    """the Weights & Biases entity (team)"""
    save_model: bool = False
    """save the final model to runs/.../{exp_name}.cleanrl_model"""
    checkpoint_interval: int = 0
    """write runs/.../checkpoint.pt every this many iterations (0: only on SIGTERM/SIGINT and at the end)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from (its run's flags and tasks.npz are used)"""
    init_from: str | None = None
    """a new run (own directory, step 0, these flags) that starts from the network weights of this script's checkpoint.pt"""
    init_optimizer: bool = False
    """with --init-from: also load its optimizer state (this run's LR, eps); never its RNG or counters. With --ewma-com the
    proximal policy starts equal to the loaded policy (W = 1), as a new run's does"""
    # Speed: none of these changes what is learned, up to float rounding
    cuda: bool = True
    """use CUDA when available, for JAX and torch alike (falls back to the CPU with a notice)"""
    torch_deterministic: bool = True
    """set `torch.backends.cudnn.deterministic`"""
    torch_threads: int | None = 1
    """torch's CPU threads: beside XLA's own threads, more than 1 made the policy 10-70x slower on 2 cores"""
    jax_cache_dir: str = os.environ.get("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/ppo_kinetix_jax"))
    """JAX's persistent compilation cache (and the task sets built): a repeat run loads the compiled step and its tasks"""
    fused_adam: bool = True
    """Adam's update of all parameters as one fused kernel (--no-fused-adam: CleanRL's per-tensor-list kernels)"""
    reuse_host_memory: bool = True
    """keep freed host memory for the next minibatch instead of page-faulting it back from the OS (glibc's mallopt)"""
    tf32: bool = True
    """on CUDA, float32 matmuls on TF32 tensor cores; off: strict fp32"""
    # Derived after validation (not flags)
    env_id: tyro.conf.Suppress[str] = ""  # Kinetix-{task_set}-{env_size}: the run directory's and aggregate.py's name
    batch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0
    scaled_learning_rate: tyro.conf.Suppress[float] = 0.0  # the LR after --lr-scaling, before annealing

    @property
    def planned_steps(self) -> int:
        return self.num_iterations * self.batch_size


# ======================================================================================================================
# ALGORITHM: the network, the maths of an iteration and the training loop. Change these to make a variant.
# ======================================================================================================================
# Copied from ppo_atari_envpool.layer_init
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(obs_dim: int, activation: type[nn.Module]) -> nn.Sequential:
    """3 hidden layers of 256 units (Beukman et al. 2026, App. A.1); the last output is the penultimate feature."""
    sizes = [(obs_dim, 256), (256, 256), (256, 256)]
    return nn.Sequential(*[layer for i, o in sizes for layer in (layer_init(nn.Linear(i, o)), activation())])


class Agent(nn.Module):
    def __init__(self, obs_dim: int, separate_networks: bool, activation: str = "tanh"):
        super().__init__()
        self.activation = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        self.actor_encoder = mlp(obs_dim, self.activation)
        self.critic_encoder = mlp(obs_dim, self.activation) if separate_networks else None
        self.actor = layer_init(nn.Linear(256, sum(ACTION_SIZES)), std=0.01)  # the heads' logits, concatenated
        self.critic = layer_init(nn.Linear(256, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate features (actor, critic) of symbolic observations."""
        actor_features = self.actor_encoder(obs)
        return actor_features, actor_features if self.critic_encoder is None else self.critic_encoder(obs)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        critic_features = self.actor_encoder(obs) if self.critic_encoder is None else self.critic_encoder(obs)
        return self.critic(critic_features).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Action (B, heads), its log-probability and entropy (summed over the heads), value, logits (B, sum of sizes)."""
        actor_features, critic_features = self.features(obs)
        logits = self.actor(actor_features)
        log_probs = head_log_probs(logits)
        action = sample_actions(log_probs) if action is None else action
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1).sum(-1)
        entropy = -(log_probs.exp() * log_probs).sum((-2, -1))  # a padded entry adds 0 x -1e9 = 0
        return action, log_prob, entropy, self.critic(critic_features).squeeze(-1), logits


def head_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """The MultiDiscrete policy's log-probabilities as (B, heads, 3): each head's log-softmax, a 2-action head padded with
    -1e9 (probability 0; finite, so neither 0 x log 0 nor its gradient is a NaN)."""
    heads = logits.split(ACTION_SIZES, dim=-1)
    padded = [nn.functional.pad(torch.log_softmax(h, -1), (0, max(ACTION_SIZES) - h.shape[-1]), value=-1e9) for h in heads]
    return torch.stack(padded, dim=-2)


def sample_actions(log_probs: torch.Tensor) -> torch.Tensor:
    """One action per head, (B, heads), by the Gumbel-max trick (see ppo_atari_envpool.sample_actions: nothing waits
    for the GPU); a padded action (-1e9) never wins."""
    noise = torch.empty_like(log_probs).exponential_().clamp_(min=torch.finfo(log_probs.dtype).tiny)
    return (log_probs - noise.log()).argmax(dim=-1)


# ---- The maths of one iteration: small functions that a test can call on hand-made tensors ----
def compute_gae(rewards, values, dones, truncation_values, next_value, gamma: float, gae_lambda: float):
    """GAE(lambda) advantages and returns over a (T, N) rollout of Kinetix (next_value: (N,)).

    Row t holds s_t, a_t, r_t and whether the step ended the episode (done). Kinetix resets in that same step: the
    observation it returns is the next episode's first, so where done[t] = 1 the value values[t + 1] belongs to
    another episode and nothing bootstraps from it; the lambda-return stops there. A time-out (a truncation: the
    episode did not end, its clock did) bootstraps instead from the value of its real last state, which the
    environment returns beside the reset one: truncation_values[t] = V(s_last) where the episode timed out, 0
    elsewhere (and for a termination, i.e. the goal or a red shape: no future). Every transition is experience:
    there is no reset step to mask.
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_advantage = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        following_value = next_value if t == num_steps - 1 else values[t + 1]
        bootstrap = following_value * (1.0 - dones[t]) + truncation_values[t]
        delta = rewards[t] + gamma * bootstrap - values[t]
        last_advantage = delta + gamma * gae_lambda * (1.0 - dones[t]) * last_advantage
        advantages[t] = last_advantage
    return advantages, advantages + values


# Copied from ppo_atari_envpool.minibatch_statistics
def minibatch_statistics(minibatch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The number of real transitions (valid = 1) in the minibatch and their advantages' mean and std, over every
    process of a torchrun run in one collective (sums in float64): what the loss divides by and normalises with."""
    mask, advantages = minibatch["valid"].double(), minibatch["advantages"].double()
    sums = all_ranks_sum(torch.stack([mask.sum(), (mask * advantages).sum(), (mask * advantages.square()).sum()]))
    count = sums[0].clamp(min=1.0)
    mean = sums[1] / count
    std = (sums[2] / count - mean.square()).clamp(min=0.0).sqrt()
    return {"valid_count": count.float(), "advantage_mean": mean.float(), "advantage_std": std.float()}


# Copied from ppo_atari_envpool.masked_mean
def masked_mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Mean of x where mask is 1, given the count of those entries over every process: under torchrun this process's
    share of the mean over every process's entries (their reset steps differ); the shares sum to the mean, and their
    gradients to its gradient."""
    return (x * mask).sum() / count


# Copied from ppo_atari_envpool.ppo_loss
def ppo_loss(
    new_logprob, new_value, entropy, minibatch, statistics, *, clip_coef, clip_vloss, ent_coef, vf_coef, norm_adv
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO objective; `minibatch` holds the rollout's logprobs, values, advantages, returns and valid (the
    reset-step mask: entries with 0 do not count); `statistics` the `minibatch_statistics` of those."""
    mask, advantages, returns, old_value = (minibatch[k] for k in ("valid", "advantages", "returns", "values"))
    count = statistics["valid_count"]
    if norm_adv:
        advantages = (advantages - statistics["advantage_mean"]) / (statistics["advantage_std"] + 1e-8)
    log_ratio = new_logprob - minibatch["logprobs"]
    ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    policy_loss = masked_mean(torch.max(-advantages * ratio, -advantages * clipped_ratio), mask, count)
    value_error = (new_value - returns).square()
    if clip_vloss:
        clipped_value = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        value_error = torch.max(value_error, (clipped_value - returns).square())
    value_loss = 0.5 * masked_mean(value_error, mask, count)
    entropy_loss = masked_mean(entropy, mask, count)
    loss = policy_loss - ent_coef * entropy_loss + vf_coef * value_loss
    stats = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy_loss}
    # Schulman's k3 estimator; expm1 keeps the digits that ratio - 1 loses near 1 (the first minibatch's rounding noise)
    stats["approx_kl"] = masked_mean(torch.expm1(log_ratio) - log_ratio, mask, count)
    stats["clipfrac"] = masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask, count)
    return loss, {name: value.detach() for name, value in stats.items()}


# Copied from ppo_ewma_atari.ppo_ewma_loss
def ppo_ewma_loss(
    new_logprob, new_value, entropy, minibatch, statistics, *, clip_coef, clip_vloss, ent_coef, vf_coef, norm_adv, weight_cap
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled clipped objective (Beukman et al. 2026 eq. 4): (pi_prox / pi_behavior) * min(r A, clip(r, 1 - eps, 1 + eps) A)
    with r = pi_theta / pi_prox; the importance weight is a constant capped at `weight_cap`. With pi_prox = pi_behavior
    this is ppo_atari_envpool.ppo_loss, whose arguments it takes; `minibatch` also holds the proximal_logprobs."""
    mask, advantages, returns, old_value = (minibatch[k] for k in ("valid", "advantages", "returns", "values"))
    count = statistics["valid_count"]
    if norm_adv:
        advantages = (advantages - statistics["advantage_mean"]) / (statistics["advantage_std"] + 1e-8)
    proximal_logprob, behavior_logprob = minibatch["proximal_logprobs"], minibatch["logprobs"]
    importance_weight = (proximal_logprob - behavior_logprob).exp().clamp(max=weight_cap).detach()
    ratio = (new_logprob - proximal_logprob).exp()
    clipped_objective = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    policy_loss = masked_mean(importance_weight * clipped_objective, mask, count)
    value_error = (new_value - returns).square()
    if clip_vloss:
        clipped_value = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        value_error = torch.max(value_error, (clipped_value - returns).square())
    value_loss = 0.5 * masked_mean(value_error, mask, count)
    entropy_loss = masked_mean(entropy, mask, count)
    loss = policy_loss - ent_coef * entropy_loss + vf_coef * value_loss
    stats = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy_loss}
    log_ratio = new_logprob - behavior_logprob  # approx KL from the behaviour policy, as PPO logs it
    stats["approx_kl"] = masked_mean(torch.expm1(log_ratio) - log_ratio, mask, count)  # Schulman's k3 (expm1: see PPO's)
    stats["clipfrac"] = masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask, count)
    return loss, {name: value.detach() for name, value in stats.items()}


def compute_gradients(agent: Agent, proximal: Agent | None, minibatch: dict, statistics: dict, args: Args, clip_coef) -> dict:
    """Forward pass, loss and backward pass of one minibatch into the parameters' .grad; returns the loss statistics.
    PPO's clipped loss, or with a proximal network (--ewma-com) PPO-EWMA's, which equals PPO's when the proximal policy
    is the behaviour policy. clip_coef comes as a tensor: --target-ddr changes it every iteration."""
    _, new_logprob, entropy, new_value, _ = agent.get_action_and_value(minibatch["obs"], minibatch["actions"])
    coefficients = {name: getattr(args, name) for name in ("clip_vloss", "ent_coef", "vf_coef", "norm_adv")}
    if proximal is None:
        loss, stats = ppo_loss(new_logprob, new_value, entropy, minibatch, statistics, clip_coef=clip_coef, **coefficients)
    else:
        with torch.no_grad():
            proximal_logprob = proximal.get_action_and_value(minibatch["obs"], minibatch["actions"])[1]
        minibatch = minibatch | {"proximal_logprobs": proximal_logprob}  # read beside the behaviour's logprobs
        coefficients |= {"clip_coef": clip_coef, "weight_cap": args.importance_weight_cap}
        loss, stats = ppo_ewma_loss(new_logprob, new_value, entropy, minibatch, statistics, **coefficients)
    loss.backward()
    return stats


@torch.no_grad()  # Copied from ppo_ewma_atari.ewma_update
def ewma_update(proximal: nn.Module, current: nn.Module, weight_sum: float, beta: float) -> float:
    """One bias-corrected EWMA step: W' = beta W + 1; theta_prox <- theta_prox * (beta W / W') + theta / W'; returns W'.
    theta_prox is then the beta-discounted average of every weight vector seen so far, the initial one included
    (W = 1 at the start), so there is no start-up bias. Deterministic: under torchrun the processes' identical weights
    keep their proximal weights identical, with no communication."""
    new_weight_sum = beta * weight_sum + 1.0
    for proximal_tensor, tensor in zip(proximal.state_dict().values(), current.state_dict().values(), strict=True):
        proximal_tensor.lerp_(tensor, 1.0 / new_weight_sum)  # the same sum: beta W / W' = 1 - 1 / W'
    return new_weight_sum


# ---- The outer loop: the learning rate and the clipping epsilon ----
# Copied from ppo_atari_envpool.learning_rate
def learning_rate(args: Args, num_envs: int, step: int) -> float:
    """--learning-rate scaled for N_envs by --lr-scaling (paper Fig. 11), annealed linearly to 0 over the planned steps."""
    k = num_envs / args.lr_reference_envs
    factors = {"none": 1, "sqrt": k**0.5, "linear": k, "inverse": 1 / k, "inverse-sqrt": k**-0.5}
    scaled = args.learning_rate * factors[args.lr_scaling]
    return scaled * (1 - step / args.planned_steps) if args.anneal_lr else scaled


# Copied from ppo_atari_envpool.adapted_step_size
def adapted_step_size(value: float, ddr: float, target: float, rate: float, bounds: tuple, sign: int = 1) -> float:
    """One step in log space towards the target data-to-divergence ratio: value * (DDR / target) ** (sign * rate), kept
    in bounds. sign +1 for a clipping epsilon (a larger epsilon, a larger KL, a smaller DDR): a DDR under the target
    shrinks it."""
    return min(max(value * (ddr / target) ** (sign * rate), bounds[0]), bounds[1])


# Copied from ppo_atari_envpool.target_ddr
def target_ddr(args: Args, step: int) -> float:
    """--target-ddr, grown geometrically to --target-ddr-final (when given) over the planned steps."""
    growth = args.target_ddr_final / args.target_ddr if args.target_ddr_final else 1.0
    return args.target_ddr * growth ** (step / args.planned_steps)


@torch.no_grad()
def behavior_kl(agent: Agent, obs: torch.Tensor, behavior_logits: torch.Tensor) -> float:
    """KL(behaviour policy || updated policy), the mean over the states (summed over the heads): the DDR's divergence."""
    return metrics.multi_discrete_kl(behavior_logits, agent.actor(agent.features(obs)[0]), ACTION_SIZES).mean().item()


# ---- Measurements after the update (the functions themselves are in metrics.py) ----
@torch.no_grad()
def measure_agent(
    agent: Agent,
    obs,
    actions,
    behavior_logits,
    batch_size: int,
    dormant_threshold: float,
    proximal,
    dormant_definition: str = "sokar",
) -> dict:
    """The metrics/ tags that need a forward pass, after the update, on the metrics batch: ratios and KL compare the
    updated policy with the policy that collected the rollout (the MultiDiscrete definitions of metrics.py); with
    PPO-EWMA, kl_prox the updated policy with the proximal policy it is clipped towards."""
    with metrics.hidden_activations(agent, agent.activation) as activations:  # every hidden layer's output
        actor_features, critic_features = agent.features(obs)
    logits = agent.actor(actor_features)
    measured = {
        "feature_rank": metrics.feature_rank(actor_features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_threshold, dormant_definition),
        "weight_norm": metrics.weight_norm(agent.parameters()),
        # ess_pct, policy_variance, kl_behavior and ddr: the updated policy against the one that collected the rollout
        **metrics.multi_discrete_policy_change(logits, behavior_logits, actions, ACTION_SIZES, batch_size),
    }
    if agent.critic_encoder is not None:
        measured["feature_rank_critic"] = metrics.feature_rank(critic_features)
    if proximal is not None:  # KL(pi_prox || pi_new)
        proximal_logits = proximal.actor(proximal.features(obs)[0])
        measured["kl_prox"] = metrics.multi_discrete_kl(proximal_logits, logits, ACTION_SIZES).mean().item()
    return measured


@torch.no_grad()
def solve_rate(agent: Agent, envs: KinetixTasks, levels, attempts: int) -> float:
    """Kinetix's measure of a policy: each level of `levels` played `attempts` times from its start, the first episode
    only, with sampled actions; the fraction of those episodes that reach the goal (Matthews et al. 2025's
    eval_utils; Beukman et al.'s solve rate). Played in batches of the training's num_envs with the training's compiled
    step (the training set: nothing compiles again), after which the training's episodes go on where they were; under
    torchrun each process plays its share."""
    training_states, num_levels = envs.states, jax.tree.leaves(levels)[0].shape[0]
    games = torch.arange(num_levels * attempts)[RANK::WORLD_SIZE] % num_levels  # level of each episode to play here
    solved, played = torch.zeros(2, dtype=torch.float64)
    for chunk in games.split(envs.num_envs):
        playing = torch.arange(envs.num_envs) < len(chunk)  # the last batch is filled up with level 0, not counted
        obs = envs.start(levels, torch.cat([chunk, chunk.new_zeros(envs.num_envs - len(chunk))]))
        finished = torch.zeros(envs.num_envs, dtype=torch.bool, device=obs.device)
        reached = torch.zeros_like(finished)
        for step in range(envs.max_timesteps):
            obs, _, outcome = envs.step(agent.get_action_and_value(obs)[0], levels)
            done, goal = outcome[:, 1].bool() | outcome[:, 2].bool(), outcome[:, 3].bool()
            reached |= done & goal & ~finished
            finished |= done
            if step % 16 == 15 and bool(finished.all()):  # one wait for the device every 16 steps
                break
        solved += reached.cpu()[playing].sum()
        played += playing.sum()
    envs.states = training_states  # JAX's arrays are immutable: the training's episodes as they were
    totals = all_ranks_sum(torch.stack([solved, played]))
    return float(totals[0] / totals[1])


@torch.no_grad()  # Copied from ppo_atari_envpool.embed
def embed(agent: Agent, obs: torch.Tensor, iteration: int, global_step: int) -> dict[str, np.ndarray]:
    """Penultimate features and critic values of a few states, for the coverage plots (paper Fig. 2)."""
    features, critic_features = agent.features(obs)
    values = agent.critic(critic_features).squeeze(-1).cpu().numpy()
    steps = {"iteration": np.full(len(obs), iteration), "global_step": np.full(len(obs), global_step)}
    return {"features": features.cpu().numpy().astype(np.float16), "values": values, **steps}


def main() -> None:
    args, checkpoint = parse_args()
    torch.manual_seed(args.seed)  # torch draws every random number of training: weights, actions, minibatches, samples
    run_dir, writer, progress, stop_signal = start_run(args, checkpoint)  # before the envs: refusals first
    device = torch.device(f"cuda:{LOCAL_RANK}" if args.cuda and torch.cuda.is_available() else "cpu")
    num_envs, minibatch_size = args.num_envs // WORLD_SIZE, args.minibatch_size // WORLD_SIZE  # this process's share

    # The task set: generated once and stored with the run (a resumed run reads it back); environments on torch's device.
    tasks = task_set(args, RUN_DIR, load=checkpoint is not None)
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    envs = KinetixTasks(tasks, num_envs, device, seed=hash((args.seed, RANK, start_iteration)) % 2**31)
    agent = Agent(envs.obs_dim, args.separate_networks, args.activation).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.scaled_learning_rate, eps=args.adam_eps, fused=args.fused_adam)
    # --init-from (a misfit removes the new run: the network's shapes come from the envs); the proximal policy is not loaded
    initialise_from(args, run_dir, model=agent, optimizer=optimizer)
    # PPO-EWMA's proximal policy (no gradients: only ewma_update moves it) starts at the initial weights (W = 1).
    proximal = copy.deepcopy(agent).requires_grad_(False) if args.ewma_com is not None else None
    state = {"model": agent, "optimizer": optimizer} | ({"proximal": proximal} if proximal is not None else {})
    global_step = restore_checkpoint(checkpoint, **state) if checkpoint else 0
    saved = checkpoint or {}  # --target-ddr adapts the clipping epsilon every iteration
    clip_coef, ewma_weight_sum = saved.get("clip_coef", args.clip_coef), saved.get("ewma_weight_sum", 1.0)
    ewma_beta = args.ewma_com / (args.ewma_com + 1) if args.ewma_com is not None else 0.0
    if WORLD_SIZE > 1:  # the same initial weights everywhere, but each process its own action noise
        torch.manual_seed(hash((args.seed, RANK, start_iteration)))

    # Rollout storage on the training device; every transition is real (valid = 1: Kinetix has no reset step).
    size = (args.num_steps, num_envs)
    widths = {"obs": envs.obs_dim, "logits": sum(ACTION_SIZES)}
    rollout = {name: torch.zeros((*size, width), device=device) for name, width in widths.items()}
    rollout["actions"] = torch.zeros((*size, len(ACTION_SIZES)), dtype=torch.long, device=device)
    for name in ("logprobs", "values", "rewards", "dones", "truncation_values"):
        rollout[name] = torch.zeros(size, device=device)
    rollout["valid"] = torch.ones(size, device=device)  # for the losses' masked means, copied from the EnvPool scripts
    finished = torch.zeros((*size, 3), device=device)  # (return, length, solved) of the episodes that end at each step
    episode = torch.zeros(num_envs, 2, device=device)  # return and length of the running episodes
    next_obs = envs.start()
    recent_returns: deque[float] = deque(maxlen=20)
    embeddings: list[dict[str, np.ndarray]] = []
    start_time, start_step, iteration = time.time(), global_step, start_iteration - 1

    for iteration in range(start_iteration, args.num_iterations + 1):
        # ==== COLLECT ROLLOUT: N_RO steps of N_envs environments with the current policy ====
        rollout_start_step = global_step
        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            with torch.inference_mode():
                action, logprob, _, value, logits = agent.get_action_and_value(next_obs)
            rollout["actions"][step], rollout["logprobs"][step] = action, logprob
            rollout["values"][step], rollout["logits"][step] = value, logits

            # outcome: (reward, terminated, truncated, solved) per environment; last_obs: the ended episodes' last state
            next_obs, last_obs, outcome = envs.step(action)
            reward, terminated, truncated, solved = outcome.unbind(1)
            done = terminated + truncated
            rollout["rewards"][step], rollout["dones"][step] = reward, done
            if args.bootstrap_timeouts:  # V(last state) of a time-out; one more critic pass over the batch, no sync
                with torch.inference_mode():
                    rollout["truncation_values"][step] = agent.get_value(last_obs) * truncated
            episode += torch.stack([reward, torch.ones_like(reward)], dim=-1)
            finished[step] = torch.cat([episode, solved[:, None]], dim=-1) * done[:, None]
            episode *= 1.0 - done[:, None]
        if stop_requested(stop_signal):  # checked once a rollout: the same answer in every process
            global_step = rollout_start_step  # the interrupted rollout is discarded
            break

        # ==== ADVANTAGES: GAE(lambda); Kinetix's same-step reset and its time-outs (see compute_gae) ====
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            gae_inputs = [rollout[name] for name in ("rewards", "values", "dones", "truncation_values")]
            rollout["advantages"], rollout["returns"] = compute_gae(*gae_inputs, next_value, args.gamma, args.gae_lambda)
        batch = {name: values.flatten(0, 1) for name, values in rollout.items()}

        # ==== UPDATE: epochs of minibatches (PPO-EWMA: the proximal EWMA after each step); collectives here ====
        optimizer.param_groups[0]["lr"] = learning_rate(args, args.num_envs, rollout_start_step)
        measure = args.metrics_interval > 0 and (iteration % args.metrics_interval == 0 or iteration == args.num_iterations)
        grad_norms, minibatch_stats, gradient_kurtosis = [], [], None
        clip_coef_tensor = torch.tensor(clip_coef, device=device)
        for _epoch in range(args.update_epochs):
            permutation = torch.randperm(len(batch["obs"]), device=device)
            for start in range(0, len(batch["obs"]), minibatch_size):
                minibatch = {name: values[permutation[start : start + minibatch_size]] for name, values in batch.items()}
                statistics = minibatch_statistics(minibatch)  # one all-reduce under torchrun
                optimizer.zero_grad()
                stats = compute_gradients(agent, proximal, minibatch, statistics, args, clip_coef_tensor)
                minibatch_stats.append(stats)
                all_ranks_sum_gradients(agent.parameters())
                if measure and gradient_kurtosis is None:
                    gradient_kurtosis = metrics.gradient_kurtosis(p.grad for p in agent.parameters() if p.grad is not None)
                grad_norms.append(nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm))
                optimizer.step()
                if proximal is not None:
                    ewma_weight_sum = ewma_update(proximal, agent, ewma_weight_sum, ewma_beta)
            if args.target_kl is not None and all_ranks_sum(minibatch_stats[-1]["approx_kl"]) > args.target_kl:
                break

        # A NaN or inf from the simulator (observations, rewards) or from the update ends the run with one line
        losses_and_norms = torch.stack([value for stats in minibatch_stats for value in stats.values()] + grad_norms)
        values = {"observations": rollout["obs"], "rewards": rollout["rewards"], "losses_or_gradients": losses_and_norms}
        stop_if_not_finite(iteration, global_step, **values)

        # ==== MEASURE AND LOG ====
        valid = batch["valid"].bool()
        charts = {"learning_rate": optimizer.param_groups[0]["lr"], "clip_coef": clip_coef}
        losses = {name: all_ranks_sum(torch.stack([s[name] for s in minibatch_stats]).mean()) for name in minibatch_stats[0]}
        values_and_returns = [all_ranks_cat(batch[name]) for name in ("values", "returns")]  # of every process
        losses["explained_variance"] = metrics.explained_variance(*values_and_returns)
        losses["first_minibatch_approx_kl"] = all_ranks_sum(minibatch_stats[0]["approx_kl"])
        measured = {}
        if measure or args.target_ddr:  # each process samples its share; under torchrun all measure the whole sample
            share = args.metrics_batch // WORLD_SIZE + (RANK < args.metrics_batch % WORLD_SIZE)  # shares sum to it
            sample = torch.nonzero(valid).squeeze(1)[torch.randperm(int(valid.sum()), device=device)[:share]]
        if measure:
            sampled = [all_ranks_cat(batch[name][sample]) for name in ("obs", "actions", "logits")]
            measured = measure_agent(
                agent, *sampled, args.batch_size, args.dormant_threshold, proximal, args.dormant_definition
            )
            measured |= {"grad_kurtosis": gradient_kurtosis, "grad_norm": torch.stack(grad_norms).mean().item()}
            if args.save_embeddings and RANK == 0:  # spread over every process's part of the sample
                every = max(1, len(sampled[0]) // args.embeddings_per_iteration)
                embeddings.append(embed(agent, sampled[0][::every][: args.embeddings_per_iteration], iteration, global_step))
        if args.target_ddr:  # the clipping epsilon follows the DDR of this update, the same in every process
            small = sample[: args.ddr_batch]  # used on the iterations without metrics
            kl = measured["kl_behavior"] if measure else behavior_kl(agent, batch["obs"][small], batch["logits"][small])
            kl = float(all_ranks_sum(torch.tensor(kl))) / WORLD_SIZE
            measured["ddr"] = metrics.data_to_divergence_ratio(args.batch_size, kl)
            charts["target_ddr"] = target_ddr(args, global_step)
            step_size = dict(ddr=measured["ddr"], target=charts["target_ddr"], rate=args.adapt_rate)
            clip_coef = adapted_step_size(clip_coef, **step_size, bounds=args.clip_coef_bounds)
        if (args.eval_interval and iteration % args.eval_interval == 0) or iteration == args.num_iterations:
            charts["solve_rate"] = solve_rate(agent, envs, envs.levels, args.eval_attempts)
        charts["SPS"] = int((global_step - start_step) / (time.time() - start_time))  # after the metrics: their cost counts
        ended = rollout["dones"].bool()
        steps = (rollout_start_step + (ended.nonzero()[:, 0] + 1) * args.num_envs).tolist()
        episodes = all_ranks_list(list(zip(steps, finished[ended].tolist(), strict=True)))
        if episodes:  # the training episodes that reached the goal
            charts["success_rate"] = float(np.mean([solved for _, (_, _, solved) in episodes]))
        for group, scalars in {"charts": charts, "losses": losses, "metrics": measured}.items():
            for name, value in scalars.items():
                writer.add_scalar(f"{group}/{name}", value, global_step)
        for step, (episode_return, length, _) in episodes:
            writer.add_scalar("charts/episodic_return", episode_return, step)
            writer.add_scalar("charts/episodic_length", length, step)
            recent_returns.append(episode_return)
        if recent_returns:  # none until an episode ends
            progress.set_postfix(episodic_return=np.mean(recent_returns), refresh=False)
        progress.update(global_step - progress.n)
        loop_state = dict(iteration=iteration, global_step=global_step, clip_coef=clip_coef, ewma_weight_sum=ewma_weight_sum)
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(run_dir, args, loop_state, embeddings, **state)

    loop_state = dict(iteration=iteration, global_step=global_step, clip_coef=clip_coef, ewma_weight_sum=ewma_weight_sum)
    finish_run(run_dir, writer, progress, args, loop_state, embeddings, stop_signal, envs=envs, **state)


# ======================================================================================================================
# THE ENVIRONMENT: Kinetix's task sets and its batched step on one device, torch tensors in and out through DLPack.
# ======================================================================================================================
def import_kinetix() -> SimpleNamespace:
    """Kinetix's environment modules. kinetix.util's __init__ imports Kinetix's training stack (distrax and a nightly
    TensorFlow Probability, optax, grain, zarr, ...), which the environment does not use: the package is registered
    bare, so that its `saving` module (the hand-designed levels) loads alone. gymnax's __init__ imports every gymnax
    environment (seaborn and scipy.stats with them: 2 s of the 4.3 s that importing Kinetix took), where Kinetix uses
    its base classes and spaces: gymnax is bare while Kinetix imports, and a later `import gymnax` gets all of it."""
    kinetix, gymnax = importlib.util.find_spec("kinetix"), importlib.util.find_spec("gymnax")  # None: ImportError below
    if kinetix and kinetix.submodule_search_locations and "kinetix.util" not in sys.modules:
        util = ModuleType("kinetix.util")
        util.__path__ = [os.path.join(kinetix.submodule_search_locations[0], "util")]
        sys.modules["kinetix.util"] = util
    bare = []
    first = not {"gymnax", "kinetix.environment"} & sys.modules.keys()  # imported already: nothing to leave out
    if gymnax and gymnax.submodule_search_locations and first:
        for name, folder in (("gymnax", ""), ("gymnax.environments", "environments")):
            sys.modules[name] = ModuleType(name)
            sys.modules[name].__path__ = [os.path.join(gymnax.submodule_search_locations[0], folder)]
            bare.append(name)
    try:
        if bare:
            from gymnax.environments.environment import EnvParams as GymnaxEnvParams  # noqa: PLC0415

            sys.modules["gymnax"].EnvParams = GymnaxEnvParams  # what kinetix.render reads
        from jax2d.engine import PhysicsEngine  # noqa: PLC0415 - after the bare kinetix.util and gymnax
        from kinetix.environment import EnvParams, make_kinetix_env  # noqa: PLC0415
        from kinetix.environment.spaces import ActionType, ObservationType  # noqa: PLC0415
        from kinetix.environment.ued.distributions import (  # noqa: PLC0415
            create_vmapped_filtered_distribution,
            sample_kinetix_level,
        )
        from kinetix.environment.ued.locomotion_distribution import sample_locomotion_level  # noqa: PLC0415
        from kinetix.environment.ued.ued_state import UEDParams  # noqa: PLC0415
        from kinetix.environment.utils import create_empty_env, static_env_params_from_size  # noqa: PLC0415
        from kinetix.util.saving import load_evaluation_levels  # noqa: PLC0415
    finally:
        for name in bare:
            del sys.modules[name]
    return SimpleNamespace(
        PhysicsEngine=PhysicsEngine,
        EnvParams=EnvParams,
        make_kinetix_env=make_kinetix_env,
        ActionType=ActionType,
        ObservationType=ObservationType,
        sample_kinetix_level=sample_kinetix_level,
        create_vmapped_filtered_distribution=create_vmapped_filtered_distribution,
        sample_locomotion_level=sample_locomotion_level,
        UEDParams=UEDParams,
        create_empty_env=create_empty_env,
        static_env_params_from_size=static_env_params_from_size,
        load_evaluation_levels=load_evaluation_levels,
    )


def level_names(size: str) -> list[str]:
    """The hand-designed levels that Kinetix ships for a size class, as load_evaluation_levels names them."""
    folder = os.path.join(importlib.util.find_spec("kinetix").submodule_search_locations[0], "levels", size)
    return sorted(f"{size}/{os.path.basename(path)}" for path in glob.glob(os.path.join(folder, "*.json")))


def task_set(args: Args, run_dir: str, load: bool = False, handmade: bool = False) -> SimpleNamespace:
    """The levels to train on, batched along their first axis (or, with `handmade`, the hand-designed levels of the
    size class). Generated once (kept in --jax-cache-dir for the next run) and stored in run_dir/tasks.npz by process
    0; `load` reads that file back, so that a resumed run trains on the very same set whatever JAX's random numbers do
    across versions."""
    kx = import_kinetix()
    static_params = kx.static_env_params_from_size(args.env_size)
    env_params = kx.EnvParams(dense_reward_scale=args.dense_reward_scale)
    template = kx.create_empty_env(static_params)
    hand_designed = handmade or args.task_set == "handmade"
    if hand_designed:
        names = args.levels.split(",") if args.levels and not handmade else level_names(args.env_size)
    else:
        names = [f"{args.task_set}_{i}" for i in range(args.num_tasks)]
    # Building a set is slow (Kinetix parses a level's JSON with eager JAX ops, ~1.5 s a level on 2 CPU cores; tracing
    # its samplers takes 5-25 s): built once, kept beside the compilation cache, named by all that defines the set
    versions = [importlib.metadata.version(package) for package in ("kinetix-env", "jax")]
    definition = [*versions, names, args.env_size, None if hand_designed else args.task_seed]
    definition += [NO_OP_FILTER, args.dense_reward_scale] if args.task_set == "random" and not hand_designed else []
    built = os.path.join(args.jax_cache_dir, f"kinetix-levels-{hashlib.sha1(repr(definition).encode()).hexdigest()[:16]}.npz")
    if load and not handmade:
        levels, names = read_levels(os.path.join(run_dir, "tasks.npz"), template)
    elif os.path.isfile(built):
        levels = read_levels(built, template)[0]
    else:
        if hand_designed:
            levels = kx.load_evaluation_levels(names, static_env_params_override=static_params)[0]
        elif args.task_set == "locomotion":  # Beukman et al.'s morphologies: a body, legs (ankles in l), the goal left/right
            sample = partial(kx.sample_locomotion_level, env_params=env_params, static_env_params=static_params)
            levels = jax.jit(jax.vmap(sample))(jax.random.split(jax.random.PRNGKey(args.task_seed), args.num_tasks))
        else:  # Kinetix's random levels of the size class, drawn as its PPO, SFL and PLR draw them (NO_OP_FILTER)
            params = dict(env_params=env_params, static_env_params=static_params, ued_params=kx.UEDParams())
            sample = partial(kx.sample_kinetix_level, engine=kx.PhysicsEngine(static_params), **params)
            env = kinetix_calls(env_params, static_params)[0]
            draw = partial(kx.create_vmapped_filtered_distribution, level_sampler=sample, n_samples=args.num_tasks, env=env)
            draw = partial(draw, env_size_name=args.env_size, **params, **NO_OP_FILTER)
            levels = jax.jit(lambda key: draw(key)[0])(jax.random.PRNGKey(args.task_seed))
        with contextlib.suppress(OSError):  # no cache, no harm; a name of its own: other processes may write it too
            os.makedirs(args.jax_cache_dir, exist_ok=True)
            write_levels(f"{built}.{os.getpid()}", jax.tree.map(np.asarray, levels), names)
            os.replace(f"{built}.{os.getpid()}", built)
    levels = jax.tree.map(np.asarray, levels)  # numpy: strongly typed, so the compiled step never sees another type
    if run_dir and not load and not handmade and RANK == 0:
        write_levels(os.path.join(run_dir, "tasks.npz"), levels, names)
    return SimpleNamespace(levels=levels, names=names, static_params=static_params, env_params=env_params)


# Kinetix's level filter (its configs/learning/ppo-base.yaml): twice --num-tasks random levels drawn, each played with
# no-op actions for 64 steps, and --num-tasks of them kept, one solved that way weighted 0.001 against 1 (without it,
# 28 of 128 random S levels were solved by doing nothing)
NO_OP_FILTER = {"do_filter_levels": True, "level_filter_sample_ratio": 2, "level_filter_n_steps": 64}


def write_levels(path: str, levels, names: list[str]) -> None:
    """A batch of levels (numpy leaves) and their names as an .npz, written atomically."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, names=np.array(names), **{f"leaf_{i}": x for i, x in enumerate(jax.tree.leaves(levels))})
    write_atomically(path, buffer.getvalue())


def read_levels(path: str, template) -> tuple:
    """The levels and names that write_levels stored, in the structure of `template` (an empty level)."""
    with np.load(path) as stored:
        leaves, names = [stored[f"leaf_{i}"] for i in range(len(jax.tree.leaves(template)))], list(stored["names"])
    return jax.tree.unflatten(jax.tree.structure(template), leaves), names


class KinetixTasks:
    """num_envs Kinetix environments (symbolic-flat observations, MultiDiscrete actions) on torch's device, stepped in
    one compiled JAX call. A finished episode restarts in the same step from a level drawn from the task set."""

    def __init__(self, tasks: SimpleNamespace, num_envs: int, device: torch.device, seed: int):
        self.num_envs, self.max_timesteps = num_envs, tasks.env_params.max_timesteps
        self.env, self.batched_step, self.first_states = kinetix_calls(tasks.env_params, tasks.static_params)
        self.device = jax.devices("gpu")[device.index or 0] if device.type == "cuda" else jax.devices("cpu")[0]
        self.key = jax.device_put(jax.random.PRNGKey(seed), self.device)
        self.levels = jax.device_put(tasks.levels, self.device)  # the task set, on the device once
        self.obs_dim = self.env.observation_space(tasks.env_params).shape[0]
        self.states = None

    def start(self, levels=None, level_index: torch.Tensor | None = None) -> torch.Tensor:
        """Every environment at the start of a level of `levels` (on the device; default: the task set): the given ones,
        else levels drawn at random; returns the observations."""
        levels = self.levels if levels is None else levels
        if level_index is None:
            self.key, key = jax.random.split(self.key)
            index = jax.random.randint(key, (self.num_envs,), 0, jax.tree.leaves(levels)[0].shape[0])
        else:
            index = jax.device_put(level_index.numpy(), self.device)
        self.states, obs = self.first_states(levels, index)
        return torch.from_dlpack(obs)

    def step(self, actions: torch.Tensor, levels=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every environment: the observations to act on (a new episode's first where one ended), the last
        observations (the ended episode's own last state where one ended), and (reward, terminated, truncated, solved)
        as a (num_envs, 4) float tensor. All three share the JAX arrays' memory."""
        actions = jax.dlpack.from_dlpack(actions.to(torch.int32).contiguous())
        levels = self.levels if levels is None else levels  # where a finished episode draws its next level
        self.key, self.states, obs, last_obs, outcome = self.batched_step(self.key, self.states, actions, levels)
        return torch.from_dlpack(obs), torch.from_dlpack(last_obs), torch.from_dlpack(outcome)


def episode_end(reward, done, timestep, distance, last_distance, finite, params) -> tuple:
    """(terminated, truncated) for one step of Kinetix. Its episode ends on the goal (a reward of +1) or a red shape
    (-1), to which the dense shaping (dense_reward_scale x the decrease in distance to the goal; 0 on an episode's first
    step) is added; on a non-finite state; or at its time limit, the only truncation. The shaping can pass 1 (2.1 seen
    as a morphology settles): the contact is told from the reward less the shaping, recomputed as Kinetix computes it
    from the distance after the step (`distance`, its info's) and before it (`last_distance`, -1 on a first step)."""
    shaping = jnp.nan_to_num(-(distance - last_distance) * params.dense_reward_scale, nan=0.0, posinf=0.0, neginf=0.0)
    shaping = jnp.where(last_distance == -1, 0.0, shaping)  # (a scale of 0 gives 0 above: nan_to_num takes 0 x inf)
    contact = jnp.abs(reward - shaping) > 0.5  # the goal or a red shape: exactly +-1 once the shaping is taken off
    truncated = done & (timestep >= params.max_timesteps) & ~contact & finite
    return done & ~truncated, truncated


@cache  # once a process per environment: a second KinetixTasks of it (a run resumed in the same process) is not traced again
def kinetix_calls(params, static_params) -> tuple:
    """Kinetix's environment for these parameters and its two compiled calls: the batched step, which restarts a
    finished episode from a level of `levels` in the same step, and the first states and observations of given levels.
    Each is compiled once per number of environments and of levels."""
    kx = import_kinetix()
    env = kx.make_kinetix_env(
        kx.ActionType.MULTI_DISCRETE,
        kx.ObservationType.SYMBOLIC_FLAT,
        None,
        params,
        static_params,
        auto_reset=False,  # the reset is ours: it keeps the last observation of an episode, which a time-out needs
    )

    def step(step_key, level_key, state, action, levels):
        last_distance = state.last_distance
        last_obs, state, reward, done, info = env.step(step_key, state, action, params)
        last_obs = jnp.nan_to_num(last_obs)  # an unstable world ends its episode (done), with a finite last state
        floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
        finite = jnp.all(jnp.stack([jnp.isfinite(x).all() for x in floats]))
        terminated, truncated = episode_end(reward, done, state.timestep, info["distance"], last_distance, finite, params)
        index = jax.random.randint(level_key, (), 0, jax.tree.leaves(levels)[0].shape[0])
        level = jax.tree.map(lambda x: x[index], levels)
        state = jax.tree.map(lambda new, old: jnp.where(done, new, old), level, state)
        obs = jnp.where(done, env.get_obs(level), last_obs)
        outcome = jnp.stack([jnp.nan_to_num(reward), terminated, truncated, done & info["GoalR"]]).astype(jnp.float32)
        return state, obs, last_obs, outcome

    def batched_step(key, states, actions, levels):
        key, *keys = jax.random.split(key, 3)
        step_keys, level_keys = (jax.random.split(k, actions.shape[0]) for k in keys)
        return key, *jax.vmap(step, in_axes=(0, 0, 0, 0, None))(step_keys, level_keys, states, actions, levels)

    def first_states(levels, index):
        states = jax.tree.map(lambda x: x[index], levels)
        return states, jax.vmap(env.get_obs)(states)

    return env, jax.jit(batched_step), jax.jit(first_states)


# ======================================================================================================================
# PLUMBING: flags, run directory, processes, checkpoints, signals, progress; no need to read it to follow the algorithm.
# The blocks marked `# Copied from` are the same in every script: `make lint` keeps them identical to their source
# (change the source, then run `make fix-copies`).
# ======================================================================================================================
def validate_and_derive(args: Args) -> Args:
    """Check every flag, and that JAX and Kinetix can run where torch does, before anything is created (one line, exit
    2); set up JAX (its device, its compilation cache); fill in the derived values. Not a copy: each script has its
    own flags."""
    require_signs(
        args,
        positive="total_timesteps num_envs num_steps update_epochs num_minibatches lr_reference_envs num_tasks "
        "metrics_batch embeddings_per_iteration learning_rate adam_eps max_grad_norm target_kl minibatch_size "
        "torch_threads target_ddr target_ddr_final adapt_rate ddr_batch importance_weight_cap eval_attempts",
        non_negative="checkpoint_interval metrics_interval eval_interval ent_coef vf_coef dormant_threshold ewma_com "
        "task_seed clip_coef dense_reward_scale",
    )
    cpus = os.cpu_count() or 1  # more threads only oversubscribe; 100,000 ended in a segfault
    require((args.torch_threads or 1) <= cpus, f"--torch-threads {args.torch_threads} is more than the {cpus} CPUs here")
    require(0 <= args.gamma <= 1, f"--gamma must be in [0, 1], got {args.gamma}")
    require(0 <= args.gae_lambda <= 1, f"--gae-lambda must be in [0, 1], got {args.gae_lambda}")
    bounds = args.clip_coef_bounds
    require(0 < bounds[0] <= bounds[1] < math.inf, f"--clip-coef-bounds {bounds} is not 0 < low <= high < inf")
    require(args.target_ddr or not args.target_ddr_final, "--target-ddr-final needs --target-ddr")
    require(args.metrics_interval or not args.save_embeddings, "--save-embeddings needs --metrics-interval > 0")
    require(jax is not None, "JAX is not installed: `make setup` installs it with Kinetix (requirements.txt)")
    try:
        import_kinetix()
    except ImportError as error:
        fail(f"Kinetix cannot be imported ({error}): `make setup` installs it (requirements-nodeps.txt)")
    require(args.task_set != "locomotion" or args.env_size != "s", "--task-set locomotion needs --env-size m or l")
    if args.resume:  # the task set that the run trained on
        tasks = os.path.join(os.path.dirname(os.path.abspath(args.resume)), "tasks.npz")
        require(os.path.isfile(tasks), f"--resume: {tasks} is missing: the run's task set is stored there")
    if args.task_set == "handmade" and args.levels:  # names of every size class: a level may be smaller than the class
        known = {name for size in "sml" for name in level_names(size)}
        unknown = [name for name in args.levels.split(",") if name not in known]
        require(not unknown, f"--levels: no hand-designed level {', '.join(unknown)}; e.g. {level_names(args.env_size)[0]}")
    gpu = args.cuda and torch.cuda.is_available()
    if gpu:  # the batch crosses from JAX to torch in place: both on the same GPU
        try:
            jax_gpus = jax.devices("gpu")
        except RuntimeError:
            jax_gpus = []
        cuda = "make kinetix-cuda (JAX's CUDA build), or --no-cuda to run both on the CPU"
        require(LOCAL_RANK < len(jax_gpus), f"JAX cannot use cuda:{LOCAL_RANK}, the GPU that torch uses: {cuda}")
    with contextlib.suppress(OSError):
        os.makedirs(args.jax_cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", args.jax_cache_dir)
    args.env_id = f"Kinetix-{args.task_set}-{args.env_size}"
    args.batch_size = args.num_envs * args.num_steps
    minibatch_size = args.minibatch_size or args.batch_size // args.num_minibatches
    split = f"--minibatch-size {args.minibatch_size}" if args.minibatch_size else f"--num-minibatches {args.num_minibatches}"
    batch = f"(num_envs * num_steps = {args.batch_size})"
    divides = minibatch_size > 0 and args.batch_size % minibatch_size == 0
    require(divides, f"{split} does not divide the batch {batch} into equal minibatches")
    fits = args.total_timesteps >= args.batch_size
    require(fits, f"--total-timesteps {args.total_timesteps} is smaller than one batch {batch}")
    shares = f"and the minibatch size {minibatch_size} must split evenly over {WORLD_SIZE} processes"
    require(args.num_envs % WORLD_SIZE == 0 and minibatch_size % WORLD_SIZE == 0, f"--num-envs {args.num_envs} {shares}")
    no_state = f"--metrics-batch {args.metrics_batch} leaves some of the {WORLD_SIZE} processes no state to measure"
    require(args.metrics_batch >= WORLD_SIZE, no_state)
    args.minibatch_size, args.num_minibatches = minibatch_size, args.batch_size // minibatch_size
    args.num_iterations = args.total_timesteps // args.batch_size
    args.scaled_learning_rate = learning_rate(args, args.num_envs, 0)
    return args


def finish_run(run_dir, writer, progress, args, loop_state, embeddings, stop_signal, envs, **modules) -> None:
    """Interrupted: save a checkpoint and exit 128 + signal. Finished: the last checkpoint (a run killed while it
    evaluates or saves the model, e.g. by Slurm after its SIGTERM, resumes there and only finishes), the solve rate on
    the hand-designed levels (--eval-handmade), embeddings and model, then done.json (the completion marker that
    sweeps/launch.sh looks for). Not a copy: the evaluation; no video (Kinetix's renderer is not installed)."""
    progress.close()
    if RANK == 0:  # every point up to the checkpoint is on the disk before it (the other processes log nothing)
        writer.flush()
    interrupted = bool(stop_signal) and loop_state["global_step"] < args.planned_steps
    loop_state = loop_state | {"iteration": loop_state["iteration"] - interrupted}  # the interrupted rollout does not count
    save_checkpoint(run_dir, args, loop_state, embeddings, **modules)  # finished too: see the docstring
    if not interrupted and args.eval_handmade:  # every process plays its share
        handmade = jax.device_put(task_set(args, run_dir, handmade=True).levels, envs.device)
        rate = solve_rate(modules["model"], envs, handmade, args.eval_attempts)
        writer.add_scalar("charts/solve_rate_handmade", rate, loop_state["global_step"])
        if RANK == 0:
            levels = len(level_names(args.env_size))
            print(f"solve rate on the {levels} hand-designed {args.env_size.upper()} levels: {rate:.3f}")
    writer.close()
    if dist.is_initialized():  # summed gradients keep every process's weights identical: check once
        state = [module.state_dict().values() for module in modules.values() if isinstance(module, nn.Module)]
        gathered = all_ranks_list([torch.cat([t.detach().double().flatten() for tensors in state for t in tensors]).cpu()])
        same = sum(torch.equal(weights, gathered[0]) for weights in gathered)  # process 0 included
        if RANK == 0:
            print(f"weights identical on {same} of {WORLD_SIZE} processes")
        dist.destroy_process_group()
    if interrupted and RANK == 0:
        resume = f"--resume {run_dir}/checkpoint.pt"
        print(f"stopped by signal {stop_signal[0]} at iteration {loop_state['iteration']}; continue with {resume}")
    if interrupted:
        sys.exit(128 + stop_signal[0])
    if RANK != 0:
        return
    if args.save_model:
        buffer = io.BytesIO()
        torch.save(modules["model"].state_dict(), buffer)
        write_atomically(os.path.join(run_dir, f"{args.exp_name}.cleanrl_model"), buffer.getvalue())
    done = {"global_step": loop_state["global_step"], "iterations": loop_state["iteration"]}
    write_atomically(os.path.join(run_dir, "done.json"), json.dumps(done).encode())


def stop_requested(stop_signal: list[int]) -> bool:  # Copied from ppo_atari_envpool.stop_requested
    """Whether a stop signal arrived; under torchrun, at any process (each process's list then holds its number).
    Every process gets the same answer: a signal that lands during the exchange counts at the next call."""
    if received := max(all_ranks_list(stop_signal[:1]), default=0):  # one process: its own first signal
        stop_signal[:] = [received]
    return bool(received)


def all_ranks_sum(x: torch.Tensor) -> torch.Tensor:  # Copied from ppo_atari_envpool.all_ranks_sum
    """The sum of x over the processes of a torchrun run; x itself in a single process."""
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
    return x


def all_ranks_list(items: list) -> list:  # Copied from ppo_atari_envpool.all_ranks_list
    """Every process's items, concatenated, under torchrun; the items themselves in a single process."""
    if not dist.is_initialized():
        return items
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, items)
    return [item for process_items in gathered for item in process_items]


def all_ranks_cat(x: torch.Tensor) -> torch.Tensor:  # Copied from ppo_atari_envpool.all_ranks_cat
    """x of every process (their lengths may differ) in process order under torchrun; x itself in a single process."""
    return torch.cat(all_ranks_list([x.cpu()])).to(x.device) if dist.is_initialized() else x


def all_ranks_sum_gradients(parameters) -> None:  # Copied from ppo_atari_envpool.all_ranks_sum_gradients
    """Under torchrun, replace each gradient by its sum over the processes, sent as one flat buffer: every loss is a
    share of the global masked mean, so this is the single-process gradient and every process takes the same step."""
    if not dist.is_initialized():
        return
    gradients = [parameter.grad for parameter in parameters]
    flat = torch.cat([gradient.flatten() for gradient in gradients])
    dist.all_reduce(flat)
    for gradient, summed in zip(gradients, flat.split([gradient.numel() for gradient in gradients]), strict=True):
        gradient.copy_(summed.view_as(gradient))


# Copied from ppo_atari_envpool.save_checkpoint
def save_checkpoint(run_dir: str, args: Args, loop_state: dict, embeddings: list, **modules) -> None:
    """The new embeddings, then checkpoint.pt (state dicts, the loop's counters and adapted values, RNG states: tensors
    and plain data for weights_only), each written to a temporary file and renamed: a crash never leaves half a file,
    nor a checkpoint past embeddings that were not saved. Process 0 writes; every process calls it."""
    if embeddings:  # appended to the run's earlier ones, less any of the iterations that a resumed run trains again
        path, buffer = os.path.join(run_dir, "embeddings.npz"), io.BytesIO()
        earlier = dict(np.load(path)) if os.path.exists(path) else {}
        before = earlier.get("iteration", np.zeros(0)) < embeddings[0]["iteration"][0]
        chunks = [{key: values[before] for key, values in earlier.items()}, *embeddings]
        np.savez_compressed(buffer, **{key: np.concatenate([chunk[key] for chunk in chunks if chunk]) for key in chunks[1]})
        write_atomically(path, buffer.getvalue())
        embeddings.clear()
    if modules and RANK == 0:
        # The training device's generator only: the run may resume on a machine with fewer GPUs.
        rng = {"torch": torch.get_rng_state(), "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else []}
        state = {name: module.state_dict() for name, module in modules.items()} | {"args": asdict(args), "rng": rng}
        buffer = io.BytesIO()
        torch.save(state | loop_state, buffer)
        write_atomically(os.path.join(run_dir, "checkpoint.pt"), buffer.getvalue())
    all_ranks_list([])  # torchrun's others wait for it: where the next phase fails for want of memory, it is there


# Copied from ppo_atari_envpool.stop_if_not_finite
def stop_if_not_finite(iteration: int, global_step: int, **values: torch.Tensor) -> None:
    """A NaN or inf in any of `values` (tensors on the training device: one host-device sync for all) ends the run with
    one line naming them, before a checkpoint can keep weights that it reached; the last checkpoint stays; exit 1."""
    finite = torch.stack([value.isfinite().all() for value in values.values()]).tolist()
    if not all(finite):
        names = ", ".join(name for name, ok in zip(values, finite, strict=True) if not ok)
        checkpoint = os.path.join(RUN_DIR, "checkpoint.pt")
        written = RUN_DIR and os.path.isfile(checkpoint)
        kept = f"the last checkpoint is unchanged: {checkpoint}" if written else "no checkpoint was written"
        fail(f"non-finite {names} at iteration {iteration} (global step {global_step:,}); {kept}", status=1)


def write_atomically(path: str, data: bytes) -> None:  # Copied from ppo_atari_envpool.write_atomically
    """Write `data` to a temporary file, flushed to the disk, and rename it to `path`: a crash never leaves half a file.
    A failed write (a full or unwritable disk) removes the temporary file, keeps what `path` held and raises an OSError
    that names `path` (see `stop_on_write_error`)."""
    try:
        with open(f"{path}.tmp", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # some file systems report a full disk only here
        os.replace(f"{path}.tmp", path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.remove(f"{path}.tmp")
        raise OSError(error.errno, error.strerror, path) from None


def stop_on_write_error(error: OSError) -> None:  # Copied from ppo_atari_envpool.stop_on_write_error
    """A full or unwritable disk ends the run with one line that names the file and the OS error, and how to resume
    from the last checkpoint when there is one; exit status 1 (2 is for bad flags)."""
    filename = os.fsdecode(error.filename) if error.filename else None  # TensorBoard's writer names it in bytes
    run_dir = os.path.dirname(filename) if filename else RUN_DIR  # no name: from TensorBoard's writer thread
    checkpoint = os.path.join(run_dir, "checkpoint.pt")
    written = run_dir and os.path.isfile(checkpoint)
    resume = f"; the last checkpoint is intact: free space, then --resume {checkpoint}" if written else ""
    fail(f"cannot write {filename or 'the event file'}: {error.strerror or error}{resume}", status=1)


def stop_if_out_of_memory(error: Exception) -> None:  # Copied from ppo_atari_envpool.stop_if_out_of_memory
    """A failed allocation (on the GPU or the host) ends the run with one line, exit 1: the envs, the rollout or a
    minibatch's forward and backward pass do not fit. The last checkpoint stays; other errors pass through."""
    if words := re.search(r"(?i)to allocate ([\d.]+) (\w+)", str(error)):  # torch's, numpy's and Warp's messages
        size = f"{float(words[1]) / 2**30:,.1f} GiB" if words[2] == "bytes" else f"{words[1]} {words[2]}"
        reason = f"tried to allocate {size}"
    elif isinstance(error, MemoryError):  # EnvPool's: std::bad_alloc
        reason = str(error) or "MemoryError"
    else:
        return
    where = "GPU" if isinstance(error, torch.OutOfMemoryError) or "device 'cuda" in str(error) else "host"  # Warp's
    checkpoint = os.path.join(RUN_DIR, "checkpoint.pt")  # e.g. a --schedule phase's, written as the phase before it ended
    resume = f"; or --resume {checkpoint} with more memory free" if RUN_DIR and os.path.isfile(checkpoint) else ""
    fail(f"out of {where} memory ({reason}): try a smaller batch or minibatch{resume}", status=1)


def restore_checkpoint(checkpoint: dict, **modules) -> int:  # Copied from ppo_atari_envpool.restore_checkpoint
    """Load the state dicts and the RNG state of a checkpoint; returns its global step."""
    try:
        for name, module in modules.items():
            module.load_state_dict(checkpoint[name])
        torch.set_rng_state(checkpoint["rng"]["torch"])
        if checkpoint["rng"]["cuda"] and torch.cuda.is_available():  # older ones saved every GPU's: the first one trained
            torch.cuda.set_rng_state(checkpoint["rng"]["cuda"][0])
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:  # e.g. from an older version
        fail(f"--resume: the checkpoint does not fit this version of {os.path.basename(__file__)} ({type(error).__name__})")
    if RANK == 0:  # once, not once per torchrun process
        print(f"resumed at iteration {checkpoint['iteration'] + 1} (global step {checkpoint['global_step']:,})")
    return checkpoint["global_step"]


def fail(message: str, status: int = 2) -> None:  # Copied from ppo_atari_envpool.fail
    """One line and an exit: status 2 for a usage error, as argparse and tyro do; 1 for a run that cannot go on."""
    sys.stderr.write(f"error: {message}\n")  # one write: the lines of torchrun's processes do not interleave
    sys.exit(status)


def require(ok: bool, message: str) -> None:  # Copied from ppo_atari_envpool.require
    if not ok:
        fail(message)


def require_signs(args: Args, positive: str, non_negative: str) -> None:  # Copied from ppo_atari_envpool.require_signs
    """The flags named in `positive` (None allowed: not given) must be finite and > 0, those in `non_negative` >= 0;
    integers other than the step budget below 2**31: EnvPool and torch take them as C ints."""
    for name in [*positive.split(), *non_negative.split()]:
        value, flag, sign = getattr(args, name), f"--{name.replace('_', '-')}", ">" if name in positive.split() else ">="
        signed = value is None or (value > 0 if sign == ">" else value >= 0) and value < math.inf
        require(signed, f"{flag} must be finite and {sign} 0, got {value}")
        small = not isinstance(value, int) or value < 2**31 or name == "total_timesteps"
        require(small, f"{flag} must be below 2**31 = 2147483648, got {value}")


def parse_args() -> tuple[Args, dict | None]:  # Copied from ppo_atari_envpool.parse_args
    """The validated flags and, with --resume, the checkpoint (whose flags replace most of the command line's). An
    --init-from checkpoint is checked here, before anything is made, and loaded by `initialise_from`."""
    args, checkpoint = tyro.cli(Args), None
    # Flags that say how to run, not what to learn (those this script has): on --resume, those given again replace the run's.
    runtime = {field.name for field in fields(Args)} & set(
        "cuda track wandb_project_name wandb_entity capture_video save_model checkpoint_interval torch_threads "
        "channels_last fused_adam reuse_host_memory compile cudagraphs bf16 tf32".split()
    )
    resume_or_init = "--resume continues a run with its flags, --init-from starts a new one from its weights: give one"
    require(args.resume is None or args.init_from is None, resume_or_init)
    require(args.init_from is not None or not args.init_optimizer, "--init-optimizer needs --init-from")
    if args.init_from is not None:
        read_checkpoint(args.init_from, "--init-from", runtime)  # refused now, not after the envs are made
    if args.resume is not None:
        checkpoint = read_checkpoint(args.resume, "--resume", runtime)
        done = os.path.join(os.path.dirname(args.resume), "done.json")  # absent: a run stopped while finishing completes
        require(not os.path.exists(done), f"--resume {args.resume!r}: that run is finished ({done})")
        given = {word[2:].split("=")[0].replace("-", "_") for word in sys.argv[1:] if word.startswith("--")}
        given |= {name.removeprefix("no_") for name in given}  # --no-cuda gives cuda
        run = checkpoint["args"]
        if unused := [name for name in sorted(given & set(run) - runtime - {"resume"}) if getattr(args, name) != run[name]]:
            print(f"notice: --resume continues the run with its own flags; not used: --{' --'.join(unused).replace('_', '-')}")
        args = Args(**{**run, **{name: getattr(args, name) for name in runtime & given}, "resume": args.resume})
    return validate_and_derive(args), checkpoint


# Copied from ppo_atari_envpool.read_checkpoint
def read_checkpoint(path: str, flag: str, runtime: set[str]) -> dict:
    """The checkpoint.pt at `path` (for `flag`: --resume or --init-from), refused in one line (exit 2) unless it is one of
    this script's: a readable file whose flags are this script's (`runtime` ones may be missing), each of its type."""
    require(os.path.isfile(path), f"{flag} {path!r}: no such checkpoint file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file is a usage error here
        fail(f"{flag} {path!r} is not a readable checkpoint ({type(error).__name__})")
    saved = checkpoint.get("args") if isinstance(checkpoint, dict) else None
    if isinstance(saved, dict) and "dormant_tau" in saved:  # written before --dormant-definition: Sokar's test, this tau
        saved |= {"dormant_definition": "sokar", "dormant_threshold": saved.pop("dormant_tau")}
        saved |= {"init_from": None, "init_optimizer": False}  # flags of the same version
    ours = isinstance(saved, dict) and {*saved, *runtime} == {f.name for f in fields(Args)}
    require(ours, f"{flag} {path!r} is not a checkpoint.pt of {os.path.basename(__file__)}")
    import typing  # noqa: PLC0415 - only here

    def fits(value, hint) -> bool:  # of the type that the field declares (or an int where it says float)
        origin, options = typing.get_origin(hint), typing.get_args(hint)
        if origin is Literal:
            return value in options
        if origin is tuple:
            return isinstance(value, tuple | list) and len(value) == len(options) and all(map(fits, value, options))
        if options:  # X | None
            return any(fits(value, option) for option in options)
        return isinstance(value, (int, float) if hint is float else hint) and (hint is bool or not isinstance(value, bool))

    hints = typing.get_type_hints(Args)  # tyro.conf.Suppress[int] is int
    wrong = {name: value for name, value in saved.items() if not fits(value, hints[name])}
    wrong |= {name: checkpoint.get(name) for name in ("iteration", "global_step") if not fits(checkpoint.get(name), int)}
    entries = ", ".join(f"{name}={value!r:.40}" for name, value in wrong.items())
    require(not wrong, f"{flag} {path!r} does not fit {os.path.basename(__file__)}: {entries}")
    return checkpoint


# Copied from ppo_atari_envpool.initialise_from
def initialise_from(args: Args, opened_run: str = "", **modules) -> None:
    """--init-from: load the network weights (the modules with parameters) of that checkpoint into `modules`, with
    --init-optimizer also the rest (optimizer, normalisers), keeping this run's optimizer settings; never its RNG state or
    counters. A tensor that does not fit these flags is named in one line (exit 2), before the run is opened; where the
    network's shapes come from the envs, made after the run was opened (`opened_run`), that new directory is removed."""
    if args.init_from is None or args.resume is not None:  # resumed: the run's own checkpoint has it all
        return
    checkpoint = torch.load(args.init_from, map_location="cpu", weights_only=True)  # parse_args has checked it
    misfit = f"--init-from {args.init_from!r} does not fit these flags"

    def refuse(reason: str) -> None:
        if opened_run and RANK == 0:  # opened by this process for this run a moment ago: nothing in it is worth keeping
            shutil.rmtree(opened_run, ignore_errors=True)
        fail(f"{misfit}: {reason}")

    loaded = {
        name: module
        for name, module in modules.items()
        if args.init_optimizer or isinstance(module, nn.Module) and any(True for _ in module.parameters())
    }
    for name, module in loaded.items():
        saved = checkpoint.get(name)
        if not isinstance(saved, dict):
            refuse(f"it has no {name}")
        if isinstance(module, nn.Module):
            ours = module.state_dict()
            for key in [*ours, *(key for key in saved if key not in ours)]:
                there, here = saved.get(key), ours.get(key)
                shapes = [
                    str(tuple(tensor.shape)) if isinstance(tensor, torch.Tensor) else "absent" for tensor in (there, here)
                ]
                if shapes[0] != shapes[1]:
                    refuse(f"{name}.{key} is {shapes[0]} there, {shapes[1]} here")
        try:
            settings = [{k: v for k, v in group.items() if k != "params"} for group in getattr(module, "param_groups", [])]
            module.load_state_dict(saved)
            for group, setting in zip(getattr(module, "param_groups", []), settings, strict=True):
                group.update(setting)  # the optimizer's moments from there; its LR, eps and kernels from this run's flags
        except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
            refuse(f"its {name} ({type(error).__name__}: {' '.join(str(error).split())[:100]})")
    if RANK == 0:
        print(
            f"initialised {', '.join(loaded)} from {args.init_from} (its run had trained {checkpoint['global_step']:,} steps)"
        )


def start_run(args: Args, checkpoint: dict | None):  # Copied from ppo_atari_envpool.start_run
    """Under torchrun, join the other processes (Gloo for CPU tensors, NCCL for CUDA ones); SIGTERM
    (Slurm pre-emption) and SIGINT (Ctrl-C) land in `stop_signal`: the loop stops and saves. Process 0 alone opens
    the run directory (the checkpoint's on --resume) with args.json, TensorBoard, W&B and the progress bar."""
    global RUN_DIR  # noqa: PLW0603 - for the lines that name the last checkpoint (out of memory: in __main__)
    gpu = args.cuda and torch.cuda.is_available()
    # On a GPU torch's host work is copies, after which its OpenMP threads spin on EnvPool's cores: one (host_threads.py)
    if threads := args.torch_threads or (1 if gpu else None):
        torch.set_num_threads(threads)
    if args.reuse_host_memory and hasattr(libc := ctypes.CDLL(None), "mallopt"):  # glibc: else each minibatch page-faults
        libc.mallopt(-1, 2**30), libc.mallopt(-3, 2**25)  # trim threshold 1 GiB, mmap threshold 32 MiB
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32  # used on Ampere GPUs and newer
    if WORLD_SIZE > 1 and gpu:
        torch.cuda.set_device(LOCAL_RANK)
    if WORLD_SIZE > 1:
        dist.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo")
    stop_signal: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))

    class OpenedOnFirstUse(SimpleNamespace):  # the event file or the progress bar, made by `open` when first used
        def __getattr__(self, name):  # a name it lacks: the opened object's
            if "opened" not in vars(self):
                self.opened = self.open()
            return getattr(self.opened, name)

    if RANK != 0:  # process 0 opens the run: a barrier that it passes at the end of this function (or exits: __main__)
        RUN_DIR = all_ranks_list([])[0]  # its path: this process's own lines can name the last checkpoint too
        return None, SimpleNamespace(add_scalar=lambda *_: None, close=lambda: None), tqdm(disable=True), stop_signal
    if checkpoint:
        run_dir = os.path.dirname(os.path.abspath(args.resume))
    else:
        run_dir = os.path.join(args.runs_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
        try:
            for suffix in itertools.count(1):  # a run started in the same second gets _2, _3, ...: never a shared one
                with contextlib.suppress(FileExistsError):  # mkdir is atomic: of two processes, one creates it
                    os.makedirs(name := run_dir if suffix == 1 else f"{run_dir}_{suffix}")  # and --runs-dir if need be
                    break
            run_dir = name
        except OSError as error:
            fail(f"cannot create the run directory {run_dir!r} ({error.strerror}): see --runs-dir and --exp-name")
        flags = {"script": os.path.basename(__file__), **asdict(args)}  # the script: launch.sh tells a variant's run apart
        flags["device"] = torch.cuda.get_device_name(LOCAL_RANK) if gpu else "cpu"
        flags["processes"] = WORLD_SIZE  # a seed names another run at another process count: its own actions, minibatches
        write_atomically(os.path.join(run_dir, "args.json"), json.dumps(flags, indent=2).encode())
    RUN_DIR = run_dir
    # Held until this process exits, however it exits: a run trained by one process at a time (launch.sh skips it). A
    # POSIX lock (lockf): it works over NFS, and this process may lock it again (tests run main() twice in-process)
    lock = os.open(os.path.join(run_dir, "lock"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another process holds it
        fail(f"{run_dir} is being trained by another process (it holds the run's lock file)")
    except OSError:
        pass  # a file system without locks (some cluster mounts): unguarded
    if args.cuda and not gpu:
        print("notice: CUDA is not available, training on the CPU")
    if args.track:
        import wandb  # noqa: PLC0415 - optional at run time

        name = os.path.basename(run_dir)
        wandb_run = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=name, id=name, dir=run_dir)
        try:
            wandb.init(**wandb_run, sync_tensorboard=True, config=asdict(args), resume="allow", save_code=True)
        except Exception as error:  # noqa: BLE001 - e.g. no API key: one line, not wandb's traceback
            fail(f"--track: Weights & Biases did not start ({' '.join(str(error).split())}); try WANDB_MODE=offline")
    # A full disk in TensorBoard's writer thread reaches the main thread as the same OSError: one message, not two
    threading.excepthook = lambda hook: None if issubclass(hook.exc_type, OSError) else threading.__excepthook__(hook)
    # The event file and the progress bar (steps, SPS, ETA, recent return: live on a terminal, a plain line every 30 s in
    # a log file). Resumed, both open at their first use, after restore_checkpoint: a checkpoint that does not fit this
    # script is refused before it adds a file or a line to the run.
    purge_step = checkpoint["global_step"] + 1 if checkpoint else None  # hides the points that the interrupted run logged
    writer = OpenedOnFirstUse(open=lambda: SummaryWriter(run_dir, purge_step=purge_step))  # after its checkpoint
    log_lines = SimpleNamespace(write=lambda text: text.strip() and print(text.strip(), flush=True), flush=lambda: None)
    output = dict(file=sys.stdout, mininterval=0.5) if sys.stdout.isatty() else dict(file=log_lines, mininterval=30)
    steps = dict(total=args.planned_steps, initial=purge_step - 1 if checkpoint else 0, unit="step", unit_scale=True)
    progress = OpenedOnFirstUse(open=lambda: tqdm(**steps, **output))  # of whole batches
    if not checkpoint:
        writer, progress = writer.open(), progress.open()
        table = "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    all_ranks_list([run_dir])  # the run is open: the other processes go on
    return run_dir, writer, progress, stop_signal


if __name__ == "__main__":  # Copied from ppo_atari_envpool.__main__
    try:
        main()
    except OSError as error:  # a full or unwritable disk, wherever it is met
        stop_on_write_error(error)
    except (MemoryError, RuntimeError) as error:  # out of memory; or Gloo's, when another torchrun process has ended
        stop_if_out_of_memory(error)
        gone = re.search(r"(closed|reset) by peer|Broken pipe|Read error|Write error", str(error))  # Gloo's wordings
        if not gone or not dist.is_initialized():
            raise
        if RUN_DIR:  # the run was open (if process 0 could not open it, its own line said why)
            checkpoint = os.path.join(RUN_DIR, "checkpoint.pt")
            kept = f"continue with --resume {checkpoint}" if os.path.isfile(checkpoint) else "no checkpoint was written"
            sys.stderr.write(f"error: another torchrun process has ended ({gone[0]}); {kept}\n")  # one line: no traceback
            sys.stderr.flush()
        os._exit(1)  # at once: sys.exit would abort in Gloo's threads
    for signum in (signal.SIGTERM, signal.SIGINT):  # done: a signal while Python shuts down must not make exit 0 143
        signal.signal(signum, signal.SIG_IGN)
