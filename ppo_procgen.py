"""PPO on Procgen (EnvPool, gymnasium API) with the metrics of Mayor et al. (ICML 2025).

    python ppo_procgen.py --env-id BigfishEasy-v0 --num-envs 64 --num-steps 256

ppo_atari_envpool.py with the IMPALA CNN (Espeholt et al. 2018) and the reference Procgen settings of the paper's
Table 2 (Cobbe et al. 2020): easy mode, all levels (`--num-levels` and `--start-level` restrict them), gamma 0.999,
rewards divided by a running std of the discounted return and clipped (`--reward-clip`), and
`charts/normalized_return` with the return ranges of `metrics.py`. EnvPool's reset step is masked out of the
losses, advantages, reward statistics and metrics; the reward statistics travel in the checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace
from typing import Annotated, Literal

import envpool
import numpy as np
import torch
import torch.distributed as dist
import tyro
from torch import nn
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import metrics

# Set by torchrun in each of its processes; a plain run is process 0 of 1.
RANK, LOCAL_RANK = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
RUN_DIR = ""  # the run directory (process 0 opens it, torchrun's others learn its path), once start_run has opened it


@dataclass
class Args:
    # The study: environment and data collection
    env_id: str = "BigfishEasy-v0"
    """EnvPool Procgen task id (easy mode: BigfishEasy-v0, StarpilotEasy-v0, ...)"""
    seed: int = 1
    """seed of the experiment (torch and the environments)"""
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
    # The algorithm
    learning_rate: float = 5e-4
    """Adam learning rate (before --lr-scaling)"""
    lr_scaling: Literal["none", "sqrt", "linear", "inverse", "inverse-sqrt"] = "none"
    """multiply the LR by sqrt(k), k, 1/k or 1/sqrt(k), k = num_envs / lr_reference_envs (paper Fig. 11: up and down)"""
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
    """PPO surrogate clipping epsilon; 0 is allowed: Beukman Fig. 6b"""
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
    capture_video: bool = False
    """after training, record one evaluation episode of the final policy to runs/.../videos/"""
    save_model: bool = False
    """save the final model to runs/.../{exp_name}.cleanrl_model"""
    checkpoint_interval: int = 0
    """write runs/.../checkpoint.pt every this many iterations (0: only on SIGTERM/SIGINT and at the end)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from (its run's flags are used)"""
    init_from: str | None = None
    """a new run (own directory, step 0, these flags) that starts from the network weights of this script's checkpoint.pt"""
    init_optimizer: bool = False
    """with --init-from: also load its optimizer state (this run's LR, eps) and the return normaliser; never its RNG or
    counters"""
    # Speed: none of these changes what is learned, up to float rounding
    cuda: bool = True
    """use CUDA when available (falls back to the CPU with a notice)"""
    torch_deterministic: bool = True
    """set `torch.backends.cudnn.deterministic`"""
    torch_threads: int | None = None
    """torch's CPU threads (default: 1 on a GPU, else torch's: OMP_NUM_THREADS, set by sweeps/launch.sh, or one per core)"""
    channels_last: bool = True
    """pixels in NHWC layout before the float conversion: oneDNN's fast convolutions (--no-channels-last: CleanRL's NCHW)"""
    fused_adam: bool = True
    """Adam's update of all parameters as one fused kernel (--no-fused-adam: CleanRL's per-tensor-list kernels)"""
    reuse_host_memory: bool = True
    """keep freed host memory for the next minibatch instead of page-faulting it back from the OS (glibc's mallopt)"""
    compile: bool = False
    """torch.compile the acting forward pass and the minibatch update (forward, loss, backward)"""
    cudagraphs: bool = False
    """with --compile on CUDA: also replay both as CUDA graphs (torch.compile's reduce-overhead mode)"""
    bf16: bool = False
    """the encoders in bfloat16 (autocast) in acting and in the update; heads, losses and metrics stay float32"""
    tf32: bool = True
    """on CUDA, float32 matmuls and convolutions on TF32 tensor cores (cuDNN's default for convolutions); off: strict fp32"""
    # Derived after validation (not flags); --minibatch-size and --num-minibatches are filled in too
    batch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0
    planned_steps: tyro.conf.Suppress[int] = 0  # steps of the num_iterations full batches that fit the budget


# ======================================================================================================================
# ALGORITHM: the network, the maths of an iteration and the training loop. Change these to make a variant.
# ======================================================================================================================
# Copied from ppo_atari_envpool.layer_init
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))) with 3x3 convolutions that keep the shape."""

    def __init__(self, channels: int):
        super().__init__()
        self.relu0, self.conv0 = nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1)
        self.relu1, self.conv1 = nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(self.relu1(self.conv0(self.relu0(x))))


def conv_sequence(in_channels: int, out_channels: int) -> nn.Sequential:
    """One IMPALA stage: a 3x3 convolution, a 3x3 max-pool with stride 2 (halves the frame), two residual blocks."""
    convolution, pool = nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1)
    return nn.Sequential(convolution, pool, ResidualBlock(out_channels), ResidualBlock(out_channels))


def impala_cnn() -> nn.Sequential:
    """Espeholt et al. 2018 encoder: stages of 16, 32, 32 channels (64x64 -> 32 -> 16 -> 8), a 256-unit dense layer; all
    with PyTorch's default init, as in CleanRL's ppo_procgen.py (only the heads are orthogonal)."""
    stages = [conv_sequence(3, 16), conv_sequence(16, 32), conv_sequence(32, 32)]
    return nn.Sequential(*stages, nn.ReLU(), nn.Flatten(), nn.Linear(32 * 8 * 8, 256), nn.ReLU())


class Agent(nn.Module):  # Copied from ppo_atari_envpool.Agent with nature_cnn->impala_cnn, 512->256
    def __init__(self, num_actions: int, separate_networks: bool, channels_last: bool = True, bf16: bool = False):
        super().__init__()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.bf16 = bf16
        self.actor_encoder = impala_cnn()
        self.critic_encoder = impala_cnn() if separate_networks else None
        self.actor = layer_init(nn.Linear(256, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(256, 1), std=1)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate features (actor, critic); uint8 pixels are scaled here (in place), after the (4x smaller)
        layout change."""
        # --bf16: the pixels go straight to bfloat16 (k / 255 rounds to the same number as through float32, one pass less
        # over the batch) and the encoders compute in it; their features come back as float32 for the heads and after
        x = obs.contiguous(memory_format=self.memory_format).to(torch.bfloat16 if self.bf16 else torch.float32).div_(255.0)
        with torch.autocast(x.device.type, torch.bfloat16) if self.bf16 else contextlib.nullcontext():
            actor_features = self.actor_encoder(x)
            critic_features = actor_features if self.critic_encoder is None else self.critic_encoder(x)
        return actor_features.float(), critic_features.float()

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)[1]).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        actor_features, critic_features = self.features(obs)
        logits = self.actor(actor_features)
        distribution = Categorical(logits=logits, validate_args=False)  # validation waits for the GPU (bool of a tensor)
        action = sample_actions(logits) if action is None else action
        value = self.critic(critic_features).squeeze(-1)
        return action, distribution.log_prob(action), distribution.entropy(), value, logits


def sample_actions(logits: torch.Tensor) -> torch.Tensor:  # Copied from ppo_atari_envpool.sample_actions
    """One action per row of (B, A) logits, drawn from softmax(logits) by the Gumbel-max trick: argmax(logits + G),
    G = -log(E), E ~ Exp(1). Categorical.sample's torch.multinomial checks its input on the host on CUDA; this never
    waits."""
    noise = torch.empty_like(logits).exponential_().clamp_(min=torch.finfo(logits.dtype).tiny)  # a 0 would always win
    return (logits - noise.log()).argmax(dim=-1)


# ---- The maths of one iteration: small functions that a test can call on hand-made tensors ----
def reset_step_mask(previous_done: torch.Tensor) -> torch.Tensor:  # Copied from ppo_atari_envpool.reset_step_mask
    """1.0 for real transitions, 0.0 for EnvPool's reset steps: after an episode ends, EnvPool's next step
    ignores the action and returns the next episode's first observation with reward 0 (cleanrl issue 475)."""
    return 1.0 - previous_done


class RunningMeanStd(nn.Module):  # Copied from ppo_isaacgym.RunningMeanStd
    """Running mean and (population) variance of a stream of (B, *shape) batches; a module so that its statistics
    follow .to(device) and state_dict(). The count starts at 1e-4 with variance 1 (as OpenAI baselines'
    VecNormalize), so the first scaled rewards are not divided by a zero variance."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Merge a batch (Chan et al.'s parallel update); rows of weight 0 (reset steps) are left out without a host sync.
        Under torchrun, the batches of every process, in one collective: the count and the sums of the deviations from
        the running mean (the same everywhere) and of their squares, summed over the processes, so all hold the same
        statistics. The buffers change in place: a compiled graph that reads them keeps their addresses."""
        batch = batch.double()
        weights = (torch.ones(len(batch), device=batch.device) if weights is None else weights).double()
        weights = weights.reshape(-1, *[1] * (batch.dim() - 1))
        deviation = batch - self.mean
        moments = (weights, weights * deviation, weights * deviation.square())  # the count, the sum, the sum of squares
        sums = all_ranks_sum(torch.cat([moment.sum(0).flatten() for moment in moments]))
        count, deviation_sum, square_sum = sums[0], *(part.view_as(self.mean) for part in sums[1:].chunk(2))
        delta = deviation_sum / count.clamp(min=1.0)  # the batch's mean minus the running mean
        var = square_sum / count.clamp(min=1.0) - delta.square()
        total = self.count + count
        self.var.copy_((self.var * self.count + var * count + delta.square() * (self.count * count / total)) / total)
        self.mean.add_(delta * (count / total))
        self.count.copy_(total)

    @property
    def std(self) -> torch.Tensor:
        return (self.var + 1e-8).sqrt()


def scale_rewards(rewards, valid, dones, discounted_return, return_rms: RunningMeanStd, gamma: float, clip: float):
    """Reward scaling of the reference Procgen PPO (baselines' VecNormalize, returns only), for one step of N envs:
    the discounted return R <- gamma R + r feeds a running variance (reset steps, valid = 0, left out), the reward
    is divided by its std and clipped to [-clip, clip], and R restarts where an episode ended.
    Returns (scaled rewards, the updated discounted return)."""
    discounted_return = discounted_return * gamma + rewards * valid  # a reset step (reward 0 in EnvPool) starts no return
    return_rms.update(discounted_return, valid)
    scaled = (rewards / return_rms.std.float()).clamp(-clip, clip)
    return scaled, discounted_return * (1.0 - dones)


# Copied from ppo_atari_envpool.compute_gae
def compute_gae(rewards, values, terminations, truncations, valid, next_value, gamma: float, gae_lambda: float):
    """GAE(lambda) advantages and returns over a (T, N) rollout with reset steps masked (next_value: (N,)).

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


def ppo_loss(  # Copied from ppo_atari_envpool.ppo_loss
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


def compute_gradients(agent: Agent, minibatch: dict, statistics: dict, args: Args) -> dict:
    """Forward pass, PPO loss and backward pass of one minibatch into the parameters' .grad (one compiled graph with
    --compile); returns the loss statistics. Not a copy: the clipping epsilon is the flag's (there is no --target-ddr)."""
    _, new_logprob, entropy, new_value, _ = agent.get_action_and_value(minibatch["obs"], minibatch["actions"])
    coefficients = {name: getattr(args, name) for name in ("clip_coef", "clip_vloss", "ent_coef", "vf_coef", "norm_adv")}
    loss, stats = ppo_loss(new_logprob, new_value, entropy, minibatch, statistics, **coefficients)
    loss.backward()
    return stats


def learning_rate(args: Args, num_envs: int, step: int) -> float:  # Copied from ppo_atari_envpool.learning_rate
    """--learning-rate scaled for N_envs by --lr-scaling (paper Fig. 11), annealed linearly to 0 over the planned steps."""
    k = num_envs / args.lr_reference_envs
    factors = {"none": 1, "sqrt": k**0.5, "linear": k, "inverse": 1 / k, "inverse-sqrt": k**-0.5}
    scaled = args.learning_rate * factors[args.lr_scaling]
    return scaled * (1 - step / args.planned_steps) if args.anneal_lr else scaled


# ---- Measurements after the update (the functions themselves are in metrics.py) ----
@torch.no_grad()  # Copied from ppo_atari_envpool.measure_agent
def measure_agent(
    agent: Agent, obs, actions, behavior_logits, batch_size: int, dormant_threshold: float, dormant_definition: str = "sokar"
) -> dict[str, float]:
    """The metrics/ tags that need a forward pass, after the update, on the metrics batch:
    ratios and KL compare the updated policy with the policy that collected the rollout."""
    with metrics.hidden_activations(agent) as activations:  # every hidden post-ReLU output, for the dormant neurons
        actor_features, critic_features = agent.features(obs)
    measured = {
        "feature_rank": metrics.feature_rank(actor_features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_threshold, dormant_definition),
        "weight_norm": metrics.weight_norm(agent.parameters()),
        # ess_pct, policy_variance, kl_behavior and ddr: the updated policy against the one that collected the rollout
        **metrics.categorical_policy_change(agent.actor(actor_features), behavior_logits, actions, batch_size),
    }
    if agent.critic_encoder is not None:
        measured["feature_rank_critic"] = metrics.feature_rank(critic_features)
    return measured


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
    device = torch.device(f"cuda:{LOCAL_RANK}" if args.cuda and torch.cuda.is_available() else "cpu")

    num_actions = envpool.make_spec(args.env_id).action_space.n
    agent = Agent(num_actions, args.separate_networks, args.channels_last, args.bf16).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=args.fused_adam)
    act, update = agent.get_action_and_value, compute_gradients
    if args.compile:  # the same functions as compiled graphs; with --cudagraphs, replayed as CUDA graphs
        torch._inductor.config.fallback_random = True  # the eager path's random numbers: a seed draws the same actions
        act, update = (torch.compile(f, mode="reduce-overhead" if args.cudagraphs else None) for f in (act, update))
    return_rms = RunningMeanStd().to(device)  # of the discounted return, for the reward scaling
    state = {"model": agent, "optimizer": optimizer, "return_rms": return_rms}  # what a checkpoint holds, with the counters
    initialise_from(args, **state)  # --init-from: before the run is opened, which a misfit must not leave behind
    run_dir, writer, progress, stop_signal = start_run(args, checkpoint)
    global_step = restore_checkpoint(checkpoint, **state) if checkpoint else 0
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    if WORLD_SIZE > 1:  # the same initial weights everywhere, but each process its own action noise
        torch.manual_seed(hash((args.seed, RANK, start_iteration)))

    # This process's EnvPool pool (easy/hard mode from the id); a resumed run plays new episodes (EnvPool cannot save them).
    num_envs = args.num_envs // WORLD_SIZE  # under torchrun each process steps its share of the envs
    seed = args.seed + start_iteration - 1  # Procgen in EnvPool seeds env i with the i-th draw of mt19937(seed) (tested)
    if WORLD_SIZE > 1:  # each process takes its share of those draws: together they step one process's envs and levels
        draws = np.random.RandomState(seed).randint(2**32, size=(WORLD_SIZE, num_envs), dtype=np.uint32)  # row r: process r
        seed = draws[RANK].view(np.int32).tolist()
    levels = dict(num_levels=args.num_levels, start_level=args.start_level)
    envs = envpool.make(args.env_id, "gymnasium", num_envs=num_envs, seed=seed, **levels)
    # Rollout storage on the training device, pixels uint8 until the network (a variant adds a field here, sets it in the loop)
    size = (args.num_steps, num_envs)
    # Frames laid out as the network reads them (NHWC with --channels-last): the flattened batch is a view, not a copy.
    shape = (size[0] * size[1], *envs.observation_space.shape)
    frames = torch.empty(shape, dtype=torch.uint8, device=device, memory_format=agent.memory_format).zero_()
    rollout = {"obs": frames.unflatten(0, size), "actions": torch.zeros(size, dtype=torch.long, device=device)}
    rollout |= {"logits": torch.zeros((*size, num_actions), device=device)}
    rollout |= {name: torch.zeros(size, device=device) for name in ("logprobs", "values", "rewards", "valid")}
    # Episode ends stay on the host until the rollout ends (one copy to the device); the reward scaling is on the device.
    host = {name: np.zeros(size, dtype=np.float32) for name in ("terminations", "truncations")}
    next_obs = torch.tensor(envs.reset()[0], device=device)
    # EnvPool's frames pass through page-locked memory on CUDA, from where the copy to the GPU runs asynchronously.
    host_obs = torch.empty_like(next_obs, device="cpu").pin_memory() if device.type == "cuda" else next_obs
    host_step = torch.empty(2, num_envs, pin_memory=device.type == "cuda")  # a step's reward and done, copied together
    next_done, discounted_return = torch.zeros(num_envs, device=device), torch.zeros(num_envs, device=device)
    episode_return = np.zeros(num_envs)
    finished_episodes: list[tuple[int, float, int]] = []  # (global step, return, length)
    recent_returns: deque[float] = deque(maxlen=20)
    normalise = args.env_id.endswith("Easy-v0")  # Cobbe et al.'s return ranges are for easy mode
    if not normalise and RANK == 0:
        print(f"notice: no easy-mode return range for {args.env_id}; charts/normalized_return is not logged")
    embeddings: list[dict[str, np.ndarray]] = []
    start_time, start_step, iteration = time.time(), global_step, start_iteration - 1

    for iteration in range(start_iteration, args.num_iterations + 1):
        # ==== COLLECT ROLLOUT: N_RO steps of N_envs environments with the current policy, rewards scaled as they come ====
        rollout_start_step, return_rms_start = global_step, {k: v.clone() for k, v in return_rms.state_dict().items()}
        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            rollout["valid"][step] = reset_step_mask(next_done)
            with torch.inference_mode():
                action, logprob, _, value, logits = act(next_obs)
            rollout["actions"][step], rollout["logprobs"][step] = action, logprob
            rollout["values"][step], rollout["logits"][step] = value, logits

            next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())  # the step's one sync
            host_obs.copy_(torch.from_numpy(next_obs_np))  # free again: the last sync waited for the forward pass that read it
            next_obs.copy_(host_obs, non_blocking=True)  # a no-op on the CPU, where host_obs is next_obs
            host["terminations"][step], host["truncations"][step] = terminations, truncations
            host_step[0], host_step[1] = torch.from_numpy(reward), torch.from_numpy(np.maximum(terminations, truncations))
            reward_now, next_done = host_step.to(device, non_blocking=True, copy=True)  # as the frames: without waiting
            rollout["rewards"][step], discounted_return = scale_rewards(
                reward_now, rollout["valid"][step], next_done, discounted_return, return_rms, args.gamma, args.reward_clip
            )

            episode_return += reward  # raw reward; 0 on reset steps
            episode_over = terminations | truncations
            for finished in zip(episode_return[episode_over], info["elapsed_step"][episode_over], strict=True):
                finished_episodes.append((global_step, *finished))
            episode_return[episode_over] = 0.0
        if stop_requested(stop_signal):  # checked once a rollout: the same answer in every process
            global_step = rollout_start_step  # the interrupted rollout is discarded
            return_rms.load_state_dict(return_rms_start)  # and what the normaliser counted of it: a resume collects it anew
            break
        rollout |= {name: torch.as_tensor(values, device=device) for name, values in host.items()}  # on the CPU: no copy

        # ==== ADVANTAGES: GAE(lambda) of the scaled rewards, EnvPool's reset steps masked ====
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            gae_inputs = [rollout[name] for name in ("rewards", "values", "terminations", "truncations", "valid")]
            rollout["advantages"], rollout["returns"] = compute_gae(*gae_inputs, next_value, args.gamma, args.gae_lambda)
        batch = {name: values.flatten(0, 1) for name, values in rollout.items()}

        # ==== UPDATE: epochs of minibatches; the collectives of torchrun are here, not in the loss ====
        optimizer.param_groups[0]["lr"] = learning_rate(args, args.num_envs, rollout_start_step)
        measure = args.metrics_interval > 0 and (iteration % args.metrics_interval == 0 or iteration == args.num_iterations)
        grad_norms, minibatch_stats, gradient_kurtosis = [], [], None
        minibatch_size = args.minibatch_size // WORLD_SIZE  # each process updates on its share of each minibatch
        for _epoch in range(args.update_epochs):
            permutation = torch.randperm(len(batch["obs"]), device=device)
            for start in range(0, len(batch["obs"]), minibatch_size):
                minibatch = {name: values[permutation[start : start + minibatch_size]] for name, values in batch.items()}
                statistics = minibatch_statistics(minibatch)  # one all-reduce under torchrun
                optimizer.zero_grad()
                stats = update(agent, minibatch, statistics, args)
                minibatch_stats.append({name: value.clone() for name, value in stats.items()})  # a CUDA graph reuses them
                all_ranks_sum_gradients(agent.parameters())
                if measure and gradient_kurtosis is None:
                    gradient_kurtosis = metrics.gradient_kurtosis(p.grad for p in agent.parameters() if p.grad is not None)
                grad_norms.append(nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm))
                optimizer.step()
            if args.target_kl is not None and all_ranks_sum(minibatch_stats[-1]["approx_kl"]) > args.target_kl:
                break

        # Procgen's frames are uint8: what could hold a NaN or inf is the rewards and what the update computed
        losses_and_norms = torch.stack([value for stats in minibatch_stats for value in stats.values()] + grad_norms)
        stop_if_not_finite(iteration, global_step, rewards=rollout["rewards"], losses_or_gradients=losses_and_norms)

        # ==== MEASURE AND LOG ====
        valid, charts, measured = batch["valid"].bool(), {"learning_rate": optimizer.param_groups[0]["lr"]}, {}
        losses = {name: all_ranks_sum(torch.stack([s[name] for s in minibatch_stats]).mean()) for name in minibatch_stats[0]}
        values_and_returns = [all_ranks_cat(batch[name][valid]) for name in ("values", "returns")]  # of every process
        losses["explained_variance"] = metrics.explained_variance(*values_and_returns)
        # The first minibatch meets the policy that collected the rollout: its ratios differ from 1 by rounding only
        losses |= {f"first_minibatch_{name}": all_ranks_sum(minibatch_stats[0][name]) for name in ("approx_kl", "clipfrac")}
        if measure:  # each process samples its share; under torchrun all measure the whole sample
            valid_index = torch.nonzero(valid).squeeze(1)
            share = args.metrics_batch // WORLD_SIZE + (RANK < args.metrics_batch % WORLD_SIZE)  # shares sum to it
            sample = valid_index[torch.randperm(valid_index.numel(), device=device)[:share]]
            sampled = [all_ranks_cat(batch[name][sample]) for name in ("obs", "actions", "logits")]
            measured = measure_agent(agent, *sampled, args.batch_size, args.dormant_threshold, args.dormant_definition)
            measured |= {"grad_kurtosis": gradient_kurtosis, "grad_norm": torch.stack(grad_norms).mean().item()}
            if args.save_embeddings and RANK == 0:  # spread over every process's part of the sample
                every = max(1, len(sampled[0]) // args.embeddings_per_iteration)
                embeddings.append(embed(agent, sampled[0][::every][: args.embeddings_per_iteration], iteration, global_step))
        charts["SPS"] = int((global_step - start_step) / (time.time() - start_time))  # after the metrics: their cost counts
        for group, scalars in {"charts": charts, "losses": losses, "metrics": measured}.items():
            for name, value in scalars.items():
                writer.add_scalar(f"{group}/{name}", value, global_step)
        for step, finished_return, finished_length in all_ranks_list(finished_episodes):
            writer.add_scalar("charts/episodic_return", finished_return, step)
            writer.add_scalar("charts/episodic_length", finished_length, step)
            if normalise:
                normalized = metrics.procgen_normalized_score(args.env_id, finished_return)
                writer.add_scalar("charts/normalized_return", normalized, step)
            recent_returns.append(float(finished_return))
        finished_episodes.clear()
        if recent_returns:  # none until a game ends
            progress.set_postfix(episodic_return=np.mean(recent_returns), refresh=False)
        progress.update(global_step - progress.n)
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(run_dir, args, {"iteration": iteration, "global_step": global_step}, embeddings, **state)

    loop_state = {"iteration": iteration, "global_step": global_step}  # Procgen's PPO adapts no value: the counters alone
    finish_run(run_dir, writer, progress, args, loop_state, embeddings, stop_signal, **state)


# ======================================================================================================================
# PLUMBING: flags, run directory, processes, checkpoints, signals, progress, video; no need to read it to follow the
# algorithm. The blocks marked `# Copied from` are the same in every script: `make lint` keeps them identical to their
# source (change the source, then run `make fix-copies`).
# ======================================================================================================================
def validate_and_derive(args: Args) -> Args:
    """Check every flag before anything is created (one line, exit 2); fill in the derived values. Not a copy: each
    script has its own flags, and this one has a single N_envs x N_RO (no --schedule) and needs Qt 5."""
    require_signs(
        args,
        positive="total_timesteps num_envs num_steps update_epochs num_minibatches lr_reference_envs metrics_batch "
        "embeddings_per_iteration learning_rate adam_eps max_grad_norm reward_clip target_kl minibatch_size "
        "torch_threads",
        non_negative="clip_coef checkpoint_interval metrics_interval ent_coef vf_coef dormant_threshold num_levels "
        "start_level",
    )
    cpus = os.cpu_count() or 1  # more threads only oversubscribe; 100,000 ended in a segfault
    require((args.torch_threads or 1) <= cpus, f"--torch-threads {args.torch_threads} is more than the {cpus} CPUs here")
    last_level = args.start_level + max(args.num_levels, 1) - 1  # Procgen's level seeds are C ints
    require(last_level < 2**31, f"--start-level + --num-levels must stay under 2**31 (the last level: {last_level:,})")
    require(0 <= args.gamma <= 1, f"--gamma must be in [0, 1], got {args.gamma}")
    require(0 <= args.gae_lambda <= 1, f"--gae-lambda must be in [0, 1], got {args.gae_lambda}")
    cudagraphs_ok = not args.cudagraphs or (args.compile and args.cuda and torch.cuda.is_available())
    require(cudagraphs_ok, "--cudagraphs needs --compile and CUDA")
    require(args.metrics_interval or not args.save_embeddings, "--save-embeddings needs --metrics-interval > 0")
    spec_class = envpool.registration.registry.specs.get(args.env_id, (0, 0))[1]  # (module, spec class, ...)
    example = "e.g. BigfishEasy-v0, StarpilotEasy-v0"
    require(spec_class == "ProcgenEnvSpec", f"--env-id {args.env_id!r} is not an EnvPool Procgen task ({example})")
    args.batch_size = batch_size = args.num_envs * args.num_steps
    minibatch_size = args.minibatch_size or batch_size // max(args.num_minibatches, 1)
    split = f"--minibatch-size {args.minibatch_size}" if args.minibatch_size else f"--num-minibatches {args.num_minibatches}"
    batch = f"batch (num_envs * num_steps = {batch_size})"
    divides = minibatch_size > 0 and batch_size % minibatch_size == 0
    require(divides, f"{split} does not divide the {batch} into equal minibatches")
    require(args.total_timesteps >= batch_size, f"--total-timesteps {args.total_timesteps} is smaller than one {batch}")
    splits = args.num_envs % WORLD_SIZE == 0 and minibatch_size % WORLD_SIZE == 0
    over = f"must split evenly over {WORLD_SIZE} processes"
    require(splits, f"--num-envs {args.num_envs} and the minibatch size {minibatch_size} {over}")
    no_state = f"--metrics-batch {args.metrics_batch} leaves some of the {WORLD_SIZE} processes no state to measure"
    require(args.metrics_batch >= WORLD_SIZE, no_state)
    try:  # EnvPool loads Procgen's C++ library, which needs Qt 5, only here
        envpool.make_spec(args.env_id)
    except ImportError as error:
        install = "`sudo apt-get install -y libqt5gui5` (Debian/Ubuntu; `make setup` does it) or `dnf install qt5-qtbase`"
        fail(f"EnvPool's Procgen cannot be loaded ({error}); if the Qt 5 runtime is missing: {install}")
    args.minibatch_size, args.num_minibatches = minibatch_size, batch_size // minibatch_size
    args.num_iterations = args.total_timesteps // batch_size
    args.planned_steps = args.num_iterations * batch_size
    top = 2**31 - args.num_iterations
    too_big = f"--seed {args.seed}, {args.num_iterations:,} iterations: env seeds (seed + iteration) are C ints"
    require(0 <= args.seed < top, f"{too_big}: keep them in [0, 2**31)")
    return args


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


# Copied from ppo_atari_envpool.finish_run
def finish_run(run_dir, writer, progress, args, loop_state, embeddings, stop_signal, **modules) -> None:
    """Interrupted: save a checkpoint and exit 128 + signal. Finished: the last checkpoint (a run killed while it saves
    the model or films the video, e.g. by Slurm after its SIGTERM, resumes there and only finishes), embeddings, model
    and video, then done.json (the completion marker that sweeps/launch.sh looks for)."""
    progress.close()
    writer.close()
    interrupted = bool(stop_signal) and loop_state["global_step"] < args.planned_steps
    loop_state = loop_state | {"iteration": loop_state["iteration"] - interrupted}  # the interrupted rollout does not count
    save_checkpoint(run_dir, args, loop_state, embeddings, **modules)  # finished too: see the docstring
    if dist.is_initialized():  # summed gradients and normaliser moments keep every process's state identical: check once
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
    if args.capture_video:
        record_video(modules["model"], args, run_dir)
    done = {"global_step": loop_state["global_step"], "iterations": loop_state["iteration"]}
    write_atomically(os.path.join(run_dir, "done.json"), json.dumps(done).encode())


@torch.no_grad()
def record_video(agent: Agent, args: Args, run_dir: str) -> None:
    """One episode of the final policy on the training levels, rendered by EnvPool, to MP4. Not a copy: each script
    plays its own kind of environment."""
    from moviepy import ImageSequenceClip  # noqa: PLC0415 - only needed here

    levels = dict(num_levels=args.num_levels, start_level=args.start_level)
    env = envpool.make(args.env_id, "gymnasium", num_envs=1, seed=args.seed, render_mode="rgb_array", **levels)
    obs, frames, episode_return, episode_over = env.reset()[0], [], 0.0, False
    agent.cpu()  # training is over
    while not episode_over:
        frames.append(env.render()[0].repeat(4, axis=0).repeat(4, axis=1))  # 64x64 pixels are too small to watch
        obs, reward, terminated, truncated, _ = env.step(agent.get_action_and_value(torch.as_tensor(obs))[0].numpy())
        episode_return += reward[0]
        episode_over = terminated[0] or truncated[0]
    path = os.path.join(run_dir, "videos", "eval.mp4")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ImageSequenceClip(frames, fps=15).write_videofile(path, logger=None)
    print(f"video of one evaluation episode (return {episode_return:g}): {path}")
    if args.track:  # in W&B too, beside the run's charts
        import wandb  # noqa: PLC0415 - optional

        wandb.log({"videos/eval": wandb.Video(path, format="mp4")})


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
