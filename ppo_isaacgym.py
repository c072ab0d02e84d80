"""Continuous-action PPO (Isaac Gym, MuJoCo Warp or EnvPool MuJoCo) with the metrics of Mayor et al. (ICML 2025).

    python ppo_isaacgym.py --env-id Ant                         # Isaac Gym, MuJoCo Warp on a GPU, else EnvPool's Ant-v5
    python ppo_isaacgym.py --backend mjwarp --env-id Humanoid   # Gymnasium's Humanoid-v5 on MuJoCo Warp
    python ppo_isaacgym.py --backend envpool --env-id Hopper-v5 --num-envs 64 --num-steps 64

PPO with a Gaussian policy (state-independent log-std; sampled actions are clipped to the action bounds, no tanh
squashing) and the reference Isaac Gym settings of CleanRL's ppo_continuous_action_isaacgym.py (4096 envs x 16 steps,
4 epochs, 2 minibatches, lr 0.0026, clip 0.2, no entropy bonus, max grad norm 1); observations and rewards normalised
by running statistics. As in the Atari scripts: EnvPool's reset step (Isaac Gym's tasks reset at the start of the next
step too) is masked out of the losses, advantages, reward statistics and metrics; the metrics of `metrics.py` every
`--metrics-interval` iterations, with the Gaussian definitions (policy variance over means and stds, exact Gaussian KL
for DDR); `--separate-networks`, `--minibatch-size` and `--lr-scaling` for the study's sweeps; checkpoints and `--resume`.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("isaacgym"):  # Isaac Gym refuses to load once torch is imported; its tasks load lazily
    import isaacgym  # noqa: F401

import ctypes
import json
import os
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace
from typing import Literal

import envpool
import numpy as np
import torch
import torch.distributed as dist
import tyro
from torch import nn
from torch.distributions import Normal
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import metrics

# Set by torchrun in each of its processes; a plain run is process 0 of 1.
RANK, LOCAL_RANK = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    seed: int = 1
    """seed of the experiment (torch and the environments)"""
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
    # Speed (none of these changes what is learned, up to float rounding)
    torch_threads: int | None = None
    """torch's CPU threads (default: torch's own, one per core); sweeps/launch.sh gives each of JOBS runs cores / JOBS"""
    fused_adam: bool = True
    """Adam's update of all parameters as one fused kernel (--no-fused-adam: CleanRL's per-tensor-list kernels)"""
    reuse_host_memory: bool = True
    """keep freed host memory for the next minibatch instead of page-faulting it back from the OS (glibc's mallopt)"""
    compile: bool = False
    """torch.compile the acting forward pass and the minibatch update (forward, loss, backward)"""
    cudagraphs: bool = False
    """with --compile on CUDA: also replay both as CUDA graphs (torch.compile's reduce-overhead mode)"""
    # Environment
    env_id: str = "Ant"
    """task: Ant or Humanoid on every backend; another Isaac Gym task (ShadowHand, ...) or EnvPool id (Hopper-v5, ...)"""
    backend: Literal["auto", "isaacgym", "mjwarp", "envpool"] = "auto"
    """simulator: auto = Isaac Gym if installed and it has the task, else MuJoCo Warp on a GPU (Ant, Humanoid), else EnvPool"""
    total_timesteps: int = 30_000_000
    """total environment steps"""
    max_episode_steps: int | None = None
    """EnvPool and MuJoCo Warp: time limit in agent steps (default: the task's own, 1000 for the MuJoCo tasks)"""
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


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(obs_dim: int) -> nn.Sequential:
    """The reference Isaac Gym PPO's encoder: 3 tanh layers of 256 units; the last output is the penultimate feature."""
    return nn.Sequential(
        layer_init(nn.Linear(obs_dim, 256)), nn.Tanh(),
        layer_init(nn.Linear(256, 256)), nn.Tanh(),
        layer_init(nn.Linear(256, 256)), nn.Tanh(),
    )  # fmt: skip


class Agent(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, separate_networks: bool):
        super().__init__()
        self.actor_encoder = mlp(obs_dim)
        self.critic_encoder = mlp(obs_dim) if separate_networks else None
        self.actor_mean = layer_init(nn.Linear(256, action_dim), std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))  # state-independent
        self.critic = layer_init(nn.Linear(256, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate features (actor, critic) of normalised observations."""
        actor_features = self.actor_encoder(obs)
        return actor_features, actor_features if self.critic_encoder is None else self.critic_encoder(obs)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)[1]).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Unclipped action, its log-probability and entropy (summed over dimensions), value, mean."""
        actor_features, critic_features = self.features(obs)
        mean = self.actor_mean(actor_features)
        # No argument validation: it checks the values on the host, which waits for the GPU at every step.
        distribution = Normal(mean, self.actor_logstd.exp().expand_as(mean), validate_args=False)
        action = distribution.sample() if action is None else action
        value = self.critic(critic_features).squeeze(-1)
        return action, distribution.log_prob(action).sum(-1), distribution.entropy().sum(-1), value, mean


@torch.no_grad()
def measure_agent(agent: Agent, obs: torch.Tensor, actions: torch.Tensor, behavior_mean: torch.Tensor,
                  behavior_std: torch.Tensor, batch_size: int, dormant_tau: float) -> dict[str, float]:  # fmt: skip
    """The metrics/ tags that need a forward pass, after the update, on the metrics batch: ratios and the exact
    Gaussian KL compare the updated policy with the policy that collected the rollout (its mean and std per state)."""
    with metrics.hidden_activations(agent, nn.Tanh) as activations:  # every hidden tanh output, for the dormant neurons
        actor_features, critic_features = agent.features(obs)
    mean = agent.actor_mean(actor_features)
    std = agent.actor_logstd.exp().expand_as(mean)
    measured = {
        "feature_rank": metrics.feature_rank(actor_features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_tau),
        "weight_norm": metrics.weight_norm(agent.parameters()),
        # ess_pct, policy_variance, kl_behavior and ddr: the updated policy against the one that collected the rollout
        **metrics.gaussian_policy_change(mean, std, behavior_mean, behavior_std, actions, batch_size),
    }
    if agent.critic_encoder is not None:
        measured["feature_rank_critic"] = metrics.feature_rank(critic_features)
    return measured


@torch.no_grad()
def embed(agent: Agent, obs: torch.Tensor, iteration: int, global_step: int) -> dict[str, np.ndarray]:
    """Penultimate features and critic values of a few states, for the coverage plots (paper Fig. 2)."""
    features, critic_features = agent.features(obs)
    values = agent.critic(critic_features).squeeze(-1)
    return {"features": features.cpu().numpy().astype(np.float16), "values": values.cpu().numpy(),
            "iteration": np.full(len(obs), iteration), "global_step": np.full(len(obs), global_step)}  # fmt: skip


# ---- The maths of one iteration: small functions that a test can call on hand-made tensors ----
def reset_step_mask(previous_done: torch.Tensor) -> torch.Tensor:
    """1.0 for real transitions, 0.0 for EnvPool's reset steps: after an episode ends, EnvPool's next step
    ignores the action and returns the next episode's first observation with reward 0 (cleanrl issue 475)."""
    return 1.0 - previous_done.float()


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


def all_ranks_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over the processes of a torchrun run; x itself in a single process."""
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
    return x


# Copied from ppo_atari_envpool.minibatch_statistics
def minibatch_statistics(minibatch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The number of real transitions (valid = 1) in the minibatch and their advantages' mean and std, over every process
    of a torchrun run in one collective (sums in float64). The loss divides by them, so that it holds no collective,
    which a compiled graph or a CUDA graph would capture."""
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


# Copied from ppo_atari_envpool.all_ranks_sum_gradients
def all_ranks_sum_gradients(parameters) -> None:
    """Under torchrun, replace each gradient by its sum over the processes, sent as one flat buffer: every loss is a
    share of the global masked mean, so this is the single-process gradient and every process takes the same step."""
    if not dist.is_initialized():
        return
    gradients = [parameter.grad for parameter in parameters]
    flat = torch.cat([gradient.flatten() for gradient in gradients])
    dist.all_reduce(flat)
    for gradient, summed in zip(gradients, flat.split([gradient.numel() for gradient in gradients]), strict=True):
        gradient.copy_(summed.view_as(gradient))


def ppo_loss(new_logprob, new_value, entropy, minibatch: dict[str, torch.Tensor], *, clip_coef: float, clip_vloss: bool,
             ent_coef: float, vf_coef: float, norm_adv: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """Clipped PPO objective; `minibatch` holds the rollout's logprobs, values, advantages,
    returns and valid (the reset-step mask: entries with 0 do not count)."""
    mask, advantages, returns, old_value = (minibatch[k] for k in ("valid", "advantages", "returns", "values"))
    count = minibatch["valid_count"]
    if norm_adv:
        advantages = (advantages - minibatch["advantage_mean"]) / (minibatch["advantage_std"] + 1e-8)
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
    stats = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy_loss,
             "approx_kl": masked_mean((ratio - 1) - log_ratio, mask, count),  # Schulman's k3 estimator
             "clipfrac": masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask, count)}  # fmt: skip
    return loss, {name: value.detach() for name, value in stats.items()}


def minibatch_backward(agent: Agent, minibatch: dict[str, torch.Tensor], args: Args) -> dict[str, torch.Tensor]:
    """Forward pass, PPO loss and backward pass of one minibatch (one compiled graph with --compile); the loss statistics."""
    _, new_logprob, entropy, new_value, _ = agent.get_action_and_value(minibatch["obs"], minibatch["actions"])
    loss, stats = ppo_loss(new_logprob, new_value, entropy, minibatch, clip_coef=args.clip_coef, clip_vloss=args.clip_vloss,
                           ent_coef=args.ent_coef, vf_coef=args.vf_coef, norm_adv=args.norm_adv)  # fmt: skip
    loss.backward()
    return stats


class RunningMeanStd(nn.Module):
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


def normalise_observations(obs: torch.Tensor, obs_rms: RunningMeanStd, clip: float) -> torch.Tensor:
    """Count the raw observations (all real states) in the statistics, then (obs - mean) / std clipped to +-clip."""
    obs_rms.update(obs)
    return ((obs - obs_rms.mean.float()) / obs_rms.std.float()).clamp(-clip, clip)


def scale_rewards(rewards, valid, dones, discounted_return, return_rms: RunningMeanStd, gamma: float, clip: float):
    """Reward scaling of baselines' VecNormalize (returns only), as the reference PPOs: the discounted return
    R <- gamma R + r feeds a running variance, the reward is divided by its std and clipped to +-clip, and R
    restarts where an episode ended. Reset steps (valid = 0) stay out of the statistics. Returns (rewards, R)."""
    discounted_return = discounted_return * gamma + rewards
    return_rms.update(discounted_return, valid)
    scaled = (rewards / return_rms.std.float()).clamp(-clip, clip)
    return scaled, discounted_return * (1.0 - dones)


def main() -> None:
    args, checkpoint = parse_args()
    run_dir, writer, progress, stop_signal = start_run(args, checkpoint)
    device = torch.device(f"cuda:{LOCAL_RANK}" if args.cuda and torch.cuda.is_available() else "cpu")
    # Under torchrun each process steps its share of the envs and updates on its share of each minibatch.
    num_envs, minibatch_size = args.num_envs // WORLD_SIZE, args.minibatch_size // WORLD_SIZE

    # A resumed run starts new episodes from another env seed: the simulators' state cannot be saved.
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    seed = args.seed + start_iteration - 1 + RANK * num_envs
    if args.backend == "mjwarp":  # the project's adapter for Gymnasium's tasks on MuJoCo Warp; it imports Warp
        from mujoco_warp_tasks import WarpTasks  # noqa: PLC0415

        envs = WarpTasks(args.env_id, num_envs, seed, device, args.max_episode_steps)
    else:
        envs = (IsaacGymTasks if args.backend == "isaacgym" else EnvPoolTasks)(args, num_envs, seed, device)
    (obs_dim,), (action_dim,) = envs.observation_space.shape, envs.action_space.shape
    bounds = torch.as_tensor(np.stack([envs.action_space.low, envs.action_space.high]), dtype=torch.float32, device=device)
    agent = Agent(obs_dim, action_dim, args.separate_networks).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.scaled_learning_rate, eps=args.adam_eps, fused=args.fused_adam)
    act, backward = agent.get_action_and_value, minibatch_backward
    if args.compile:  # the same functions as compiled graphs; with --cudagraphs, replayed as CUDA graphs
        torch._inductor.config.fallback_random = True  # the eager path's random numbers: a seed draws the same actions
        act, backward = (torch.compile(f, mode="reduce-overhead" if args.cudagraphs else None) for f in (act, backward))
    obs_rms, return_rms = RunningMeanStd((obs_dim,)).to(device), RunningMeanStd().to(device)
    modules = {"model": agent, "optimizer": optimizer, "obs_rms": obs_rms, "return_rms": return_rms}
    global_step = restore_checkpoint(checkpoint, **modules) if checkpoint else 0
    if WORLD_SIZE > 1:  # process 0's initial weights everywhere (a simulator may reseed torch), each its own action noise
        for parameter in agent.parameters():
            dist.broadcast(parameter.detach(), src=0)
        torch.manual_seed(hash((args.seed, RANK, start_iteration)))

    # Rollout storage on the training device: normalised observations, unclipped actions, the behaviour policy's means.
    size = (args.num_steps, num_envs)
    widths = {"obs": obs_dim, "actions": action_dim, "means": action_dim}
    rollout = {name: torch.zeros(size + (width,), device=device) for name, width in widths.items()}
    for name in ("logprobs", "values", "rewards", "terminations", "truncations", "valid"):
        rollout[name] = torch.zeros(size, device=device)
    finished = torch.zeros(size + (2,), device=device)  # (return, length) of the episodes that end at each step

    next_obs = normalise_observations(envs.reset(), obs_rms, args.obs_clip)
    next_done = torch.zeros(num_envs, device=device)
    discounted_return = torch.zeros(num_envs, device=device)  # for the reward scaling
    episode = torch.zeros(num_envs, 2, device=device)  # raw return and length of the running episodes
    recent_returns: deque[float] = deque(maxlen=20)
    embeddings: list[dict[str, np.ndarray]] = []
    start_time, start_step = time.time(), global_step

    for iteration in range(start_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.scaled_learning_rate * (1 - (iteration - 1) / args.num_iterations)
        behavior_std = agent.actor_logstd.detach().exp()  # the same for every state of the rollout

        rollout_start_step = global_step
        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            rollout["valid"][step] = valid = reset_step_mask(next_done)
            with torch.inference_mode():
                action, logprob, _, value, mean = act(next_obs)
            rollout["actions"][step], rollout["logprobs"][step] = action, logprob
            rollout["values"][step], rollout["means"][step] = value, mean

            raw_obs, reward, rollout["terminations"][step], rollout["truncations"][step] = envs.step(action.clamp(*bounds))
            next_obs = normalise_observations(raw_obs, obs_rms, args.obs_clip)
            next_done = torch.maximum(rollout["terminations"][step], rollout["truncations"][step])
            rollout["rewards"][step], discounted_return = scale_rewards(reward, valid, next_done, discounted_return,
                                                                        return_rms, args.gamma, args.reward_clip)  # fmt: skip
            # Real transitions only (Isaac Gym's reset step has a reward); read back once per iteration, not per step.
            episode += torch.stack([reward, torch.ones_like(reward)], dim=-1) * valid[:, None]
            finished[step] = episode * next_done[:, None]
            episode *= 1.0 - next_done[:, None]
        if stop_requested(stop_signal):  # checked once a rollout: the same answer in every process
            global_step = rollout_start_step  # the interrupted rollout is discarded
            break

        ended = torch.maximum(rollout["terminations"], rollout["truncations"]).bool()
        steps = (rollout_start_step + (ended.nonzero()[:, 0] + 1) * args.num_envs).tolist()
        for step, (episode_return, length) in all_ranks_list(list(zip(steps, finished[ended].tolist(), strict=True))):
            writer.add_scalar("charts/episodic_return", episode_return, step)
            writer.add_scalar("charts/episodic_length", length, step)
            recent_returns.append(episode_return)

        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            rollout["advantages"], rollout["returns"] = compute_gae(
                rollout["rewards"], rollout["values"], rollout["terminations"], rollout["truncations"],
                rollout["valid"], next_value, args.gamma, args.gae_lambda)  # fmt: skip
        batch = {name: values.flatten(0, 1) for name, values in rollout.items()}

        measure = args.metrics_interval > 0 and (iteration % args.metrics_interval == 0 or iteration == args.num_iterations)
        grad_norms, minibatch_stats, gradient_kurtosis = [], [], None
        for _epoch in range(args.update_epochs):
            permutation = torch.randperm(len(batch["obs"]), device=device)
            for start in range(0, len(batch["obs"]), minibatch_size):
                minibatch = {name: values[permutation[start : start + minibatch_size]] for name, values in batch.items()}
                minibatch |= minibatch_statistics(minibatch)  # outside the compiled update: it holds the collective
                optimizer.zero_grad()
                # .clone(): a CUDA graph overwrites its outputs at its next replay
                stats = {name: value.clone() for name, value in backward(agent, minibatch, args).items()}
                all_ranks_sum_gradients(agent.parameters())
                if measure and gradient_kurtosis is None:
                    gradient_kurtosis = metrics.gradient_kurtosis(p.grad for p in agent.parameters() if p.grad is not None)
                grad_norms.append(nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm))
                optimizer.step()
                minibatch_stats.append(stats)
            if args.target_kl is not None and all_ranks_sum(stats["approx_kl"]) > args.target_kl:
                break

        valid, charts, measured = batch["valid"].bool(), {"learning_rate": optimizer.param_groups[0]["lr"]}, {}
        losses = {name: all_ranks_sum(torch.stack([s[name] for s in minibatch_stats]).mean()) for name in minibatch_stats[0]}
        losses["explained_variance"] = metrics.explained_variance(batch["values"][valid], batch["returns"][valid])
        if measure:
            valid_index = torch.nonzero(valid).squeeze(1)
            sample = valid_index[torch.randperm(valid_index.numel(), device=device)[: args.metrics_batch]]
            measured = measure_agent(agent, batch["obs"][sample], batch["actions"][sample], batch["means"][sample],
                                     behavior_std.expand(len(sample), -1), args.batch_size, args.dormant_tau)  # fmt: skip
            measured |= {"grad_kurtosis": gradient_kurtosis, "grad_norm": torch.stack(grad_norms).mean().item()}
            if args.save_embeddings and RANK == 0:
                embeddings.append(embed(agent, batch["obs"][sample[: args.embeddings_per_iteration]], iteration, global_step))
        charts["SPS"] = int((global_step - start_step) / (time.time() - start_time))  # after the metrics: their cost counts
        for group, scalars in {"charts": charts, "losses": losses, "metrics": measured}.items():
            for name, value in scalars.items():
                writer.add_scalar(f"{group}/{name}", value, global_step)
        progress.set_postfix(episodic_return=np.mean(recent_returns) if recent_returns else float("nan"), refresh=False)
        progress.update(global_step - progress.n)
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(run_dir, args, iteration, global_step, embeddings, **modules)

    finish_run(run_dir, writer, progress, args, global_step, embeddings, stop_signal, **modules)


# ---- Plumbing, not part of the algorithm: flags, run directory, checkpoints, progress, the two simulators ----
# (every script of the project has its own copy of this part)
def fail(message: str) -> None:
    """A usage error: one line and exit status 2, as argparse and tyro do."""
    sys.stderr.write(f"error: {message}\n")  # one write: the lines of torchrun's processes do not interleave
    sys.exit(2)


def parse_args() -> tuple[Args, dict | None]:
    """The validated flags and, with --resume, the checkpoint (whose flags replace most of the command line's)."""
    args, checkpoint = tyro.cli(Args), None
    # Flags that say how to run, not what to learn: on --resume only these come from the command line.
    runtime = ("cuda", "track", "wandb_project_name", "wandb_entity", "save_model", "checkpoint_interval", "torch_threads",
               "fused_adam", "reuse_host_memory", "compile", "cudagraphs")  # fmt: skip
    if args.resume is not None:
        if not os.path.isfile(args.resume):
            fail(f"--resume {args.resume!r}: no such checkpoint file")
        try:
            checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable file is a usage error here
            fail(f"--resume {args.resume!r} is not a readable checkpoint ({type(error).__name__})")
        if not isinstance(checkpoint, dict) or {*checkpoint.get("args", ()), *runtime} != {f.name for f in fields(Args)}:
            fail(f"--resume {args.resume!r} is not a checkpoint.pt of {os.path.basename(__file__)}")
        args = Args(**{**checkpoint["args"], **{name: getattr(args, name) for name in runtime}, "resume": args.resume})
    return validate_and_derive(args), checkpoint


def validate_and_derive(args: Args) -> Args:
    """Pick the simulator and the task's name there; check every flag before anything is created (one line,
    exit 2); fill in the derived values."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    positive = ("total_timesteps", "max_episode_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                "minibatch_size", "lr_reference_envs", "metrics_batch", "embeddings_per_iteration", "learning_rate",
                "adam_eps", "clip_coef", "max_grad_norm", "target_kl", "obs_clip", "reward_clip", "torch_threads")  # fmt: skip
    non_negative = ("checkpoint_interval", "metrics_interval", "ent_coef", "vf_coef", "dormant_tau")
    isaacgym = all(importlib.util.find_spec(name) for name in ("isaacgym", "isaacgymenvs"))
    mjwarp = all(importlib.util.find_spec(name) for name in ("mujoco_warp", "warp"))
    tasks = importlib.import_module("isaacgymenvs.tasks").isaacgym_task_map if isaacgym and args.backend != "envpool" else {}
    # Ant and Humanoid name the same task on every simulator, so that one sweep runs anywhere: Isaac Gym's tasks, and
    # Gymnasium's Ant-v5 and Humanoid-v5 on MuJoCo Warp and EnvPool.
    task = args.env_id.removesuffix("-v5") if args.env_id in ("Ant-v5", "Humanoid-v5") else args.env_id
    gpu = args.cuda and torch.cuda.is_available()
    if args.backend == "auto":  # MuJoCo Warp on a CPU is far slower than EnvPool
        auto_warp = mjwarp and gpu and task in MJWARP_TASKS and warp_gpu_problem() is None
        args.backend = "isaacgym" if task in tasks else "mjwarp" if auto_warp else "envpool"
    args.env_id = task if args.backend != "envpool" else {"Ant": "Ant-v5", "Humanoid": "Humanoid-v5"}.get(task, task)
    args.batch_size = args.num_envs * args.num_steps
    minibatch_size = args.minibatch_size or args.batch_size // max(args.num_minibatches, 1)
    split = f"--minibatch-size {args.minibatch_size}" if args.minibatch_size else f"--num-minibatches {args.num_minibatches}"
    value = lambda name: getattr(args, name)  # noqa: E731
    checks = [(value(name) is None or value(name) > 0, f"{flag(name)} must be > 0, got {value(name)}") for name in positive]
    checks += [(value(name) >= 0, f"{flag(name)} must be >= 0, got {value(name)}") for name in non_negative]
    checks += [
        (0 <= args.gamma <= 1, f"--gamma must be in [0, 1], got {args.gamma}"),
        (0 <= args.gae_lambda <= 1, f"--gae-lambda must be in [0, 1], got {args.gae_lambda}"),
        (not args.cudagraphs or (args.compile and args.cuda and torch.cuda.is_available()),
         "--cudagraphs needs --compile and CUDA"),
        (args.backend != "isaacgym" or isaacgym,
         "--backend isaacgym: Isaac Gym is not installed (it is not on PyPI): download Isaac Gym Preview 4 from "
         "https://developer.nvidia.com/isaac-gym, `pip install -e isaacgym/python`, then `pip install -e .` in a clone of "
         "https://github.com/isaac-sim/IsaacGymEnvs; or run the MuJoCo counterpart with --backend envpool"),
        (args.backend != "isaacgym" or args.env_id in tasks,
         f"--env-id {args.env_id!r} is not an Isaac Gym task (known: {', '.join(sorted(tasks))})"),
        (args.backend != "isaacgym" or args.max_episode_steps is None,
         "--max-episode-steps applies to --backend envpool and mjwarp (Isaac Gym tasks set their own episode length)"),
        (args.backend != "mjwarp" or mjwarp,
         "--backend mjwarp: MuJoCo Warp is not installed: pip install mujoco-warp==4.0.0 warp-lang==1.19.0 (or make setup)"),
        (args.backend != "mjwarp" or args.env_id in MJWARP_TASKS,
         f"--env-id {args.env_id!r} is not a MuJoCo Warp task (known: {', '.join(MJWARP_TASKS)})"),
        (args.backend != "envpool" or envpool.registration.registry.specs.get(args.env_id, ("",))[0] == "envpool.mujoco.gym",
         f"--env-id {args.env_id!r} is not an EnvPool MuJoCo task (e.g. Ant-v5, Humanoid-v5, HalfCheetah-v5, Hopper-v5, "
         f"Walker2d-v5){'' if isaacgym else '; Isaac Gym tasks need Isaac Gym installed'}"),
        (minibatch_size > 0 and args.batch_size % minibatch_size == 0,
         f"{split} does not divide the batch (num_envs * num_steps = {args.batch_size}) into equal minibatches"),
        (args.total_timesteps >= args.batch_size,
         f"--total-timesteps {args.total_timesteps} is smaller than one batch (num_envs * num_steps = {args.batch_size})"),
        (args.num_envs % WORLD_SIZE == 0 and minibatch_size % WORLD_SIZE == 0,
         f"--num-envs {args.num_envs} and the minibatch size {minibatch_size} must split evenly over {WORLD_SIZE} processes"),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            fail(message)
    if args.backend == "mjwarp" and gpu and (problem := warp_gpu_problem()):
        fail(problem)
    args.minibatch_size, args.num_minibatches = minibatch_size, args.batch_size // minibatch_size
    args.num_iterations = args.total_timesteps // args.batch_size
    k = args.num_envs / args.lr_reference_envs  # paper Fig. 11
    lr_factor = {"none": 1, "sqrt": k**0.5, "linear": k, "inverse": 1 / k}[args.lr_scaling]
    args.scaled_learning_rate = args.learning_rate * lr_factor
    return args


def start_run(args: Args, checkpoint: dict | None):
    """Seed torch; under torchrun, join the other processes (Gloo for CPU tensors, NCCL for CUDA ones); SIGTERM
    (Slurm pre-emption) and SIGINT (Ctrl-C) land in `stop_signal`: the loop stops and saves. Process 0 alone opens
    the run directory (the checkpoint's on --resume) with args.json, TensorBoard, W&B and the progress bar."""
    torch.manual_seed(args.seed)  # torch draws every random number of training: actions, minibatches, samples
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.reuse_host_memory and hasattr(libc := ctypes.CDLL(None), "mallopt"):  # glibc: else each minibatch page-faults
        libc.mallopt(-1, 2**30), libc.mallopt(-3, 2**25)  # trim threshold 1 GiB, mmap threshold 32 MiB
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if WORLD_SIZE > 1 and args.cuda and torch.cuda.is_available():
        torch.cuda.set_device(LOCAL_RANK)
        dist.init_process_group("cpu:gloo,cuda:nccl")
    elif WORLD_SIZE > 1:
        dist.init_process_group("gloo")
    stop_signal: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))
    if RANK != 0:
        return None, SimpleNamespace(add_scalar=lambda *_: None, close=lambda: None), tqdm(disable=True), stop_signal
    if checkpoint:
        run_dir = os.path.dirname(os.path.abspath(args.resume))
    else:
        run_dir = os.path.join(args.runs_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
        try:
            os.makedirs(run_dir, exist_ok=True)
        except OSError as error:
            fail(f"--runs-dir {args.runs_dir!r}: cannot create a run directory there ({error.strerror})")
        with open(os.path.join(run_dir, "args.json"), "w") as f:
            json.dump(asdict(args), f, indent=2)
    if args.cuda and not torch.cuda.is_available():
        print("notice: CUDA is not available, training on the CPU")
    if args.track:
        import wandb  # noqa: PLC0415 - optional at run time

        name = os.path.basename(run_dir)
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=asdict(args),
                   name=name, id=name, resume="allow", dir=run_dir, save_code=True)  # fmt: skip
    writer = SummaryWriter(run_dir)
    if not checkpoint:
        table = "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    # Steps, SPS, ETA, recent return: live on a terminal, a plain line every 30 s in a log file.
    live = sys.stdout.isatty()
    log_lines = SimpleNamespace(write=lambda text: text.strip() and print(text.strip(), flush=True), flush=lambda: None)
    progress = tqdm(total=args.total_timesteps, initial=checkpoint["global_step"] if checkpoint else 0, unit="step",
                    unit_scale=True, file=sys.stdout if live else log_lines, mininterval=0.5 if live else 30)  # fmt: skip
    return run_dir, writer, progress, stop_signal


def stop_requested(stop_signal: list[int]) -> bool:
    """Whether a stop signal arrived; under torchrun, at any process (each process's list then holds its number).
    Every process gets the same answer: a signal that lands during the exchange counts at the next call."""
    if received := max(all_ranks_list(stop_signal[:1]), default=0):  # one process: its own first signal
        stop_signal[:] = [received]
    return bool(received)


def all_ranks_list(items: list) -> list:
    """Every process's items, concatenated, under torchrun; the items themselves in a single process."""
    if not dist.is_initialized():
        return items
    gathered = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, items)
    return [item for process_items in gathered for item in process_items]


def save_checkpoint(run_dir: str, args: Args, iteration: int, global_step: int, embeddings: list, **modules) -> None:
    """checkpoint.pt (state dicts, counters, RNG states: tensors and plain data for weights_only) and the
    new embeddings, each written to a temporary file and renamed: a crash never leaves half a file. Process 0 only."""
    if modules and RANK == 0:
        # The training device's generator only: the run may resume on a machine with fewer GPUs.
        rng = {"torch": torch.get_rng_state(), "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else []}
        state = {name: module.state_dict() for name, module in modules.items()} | {"args": asdict(args), "rng": rng}
        path = os.path.join(run_dir, "checkpoint.pt")
        torch.save(state | {"iteration": iteration, "global_step": global_step}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    if embeddings:  # appended to what the run saved before
        path = os.path.join(run_dir, "embeddings.npz")
        chunks = ([dict(np.load(path))] if os.path.exists(path) else []) + embeddings
        np.savez_compressed(f"{path}.tmp.npz", **{key: np.concatenate([chunk[key] for chunk in chunks]) for key in chunks[0]})
        os.replace(f"{path}.tmp.npz", path)
        embeddings.clear()


def restore_checkpoint(checkpoint: dict, **modules) -> int:
    """Load the state dicts and the RNG state of a checkpoint; returns its global step."""
    try:
        for name, module in modules.items():
            module.load_state_dict(checkpoint[name])
    except (KeyError, RuntimeError, ValueError) as error:  # e.g. written by an older version of the script
        fail(f"--resume: the checkpoint does not fit this version of {os.path.basename(__file__)} ({type(error).__name__})")
    torch.set_rng_state(checkpoint["rng"]["torch"])
    if checkpoint["rng"]["cuda"] and torch.cuda.is_available():  # older versions saved every visible GPU's: the first trained
        torch.cuda.set_rng_state(checkpoint["rng"]["cuda"][0])
    print(f"resumed at iteration {checkpoint['iteration'] + 1} (global step {checkpoint['global_step']:,})")
    return checkpoint["global_step"]


def finish_run(run_dir, writer, progress, args, global_step, embeddings, stop_signal, **modules) -> None:
    """Interrupted: save a checkpoint and exit 128 + signal. Finished: the last checkpoint (with --checkpoint-interval),
    embeddings and model, then done.json (the completion marker that sweeps/launch.sh looks for)."""
    progress.close()
    writer.close()
    iteration = global_step // args.batch_size  # iterations completed: an interrupted rollout is not counted
    interrupted = bool(stop_signal) and iteration < args.num_iterations
    checkpointed = modules if interrupted or args.checkpoint_interval else {}  # else only the embeddings
    save_checkpoint(run_dir, args, iteration, global_step, embeddings, **checkpointed)
    if dist.is_initialized():  # summed gradients and moments keep every process's weights and normalisers equal
        state = [*modules["model"].parameters(), *modules["obs_rms"].buffers(), *modules["return_rms"].buffers()]
        gathered = all_ranks_list([torch.cat([tensor.detach().double().flatten() for tensor in state]).cpu()])
        same = sum(torch.equal(weights, gathered[0]) for weights in gathered)  # process 0 included
        if RANK == 0:
            print(f"weights identical on {same} of {WORLD_SIZE} processes")
        dist.destroy_process_group()
    if interrupted and RANK == 0:
        print(f"stopped by signal {stop_signal[0]} at iteration {iteration}; continue with --resume {run_dir}/checkpoint.pt")
    if interrupted:
        sys.exit(128 + stop_signal[0])
    if RANK != 0:
        return
    if args.save_model:  # the policy acts on normalised observations: their statistics belong with the weights
        path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        torch.save({name: modules[name].state_dict() for name in ("model", "obs_rms")}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    with open(os.path.join(run_dir, "done.json"), "w") as f:
        json.dump({"global_step": global_step, "iterations": iteration}, f)


MJWARP_TASKS = ("Ant", "Humanoid")  # mujoco_warp_tasks.TASKS, named here without importing Warp


def warp_gpu_problem() -> str | None:
    """Why Warp cannot run on the GPU that torch sees (e.g. an NVIDIA driver older than warp-lang 1.19 needs), or None."""
    import warp as wp  # noqa: PLC0415 - only for --backend mjwarp

    wp.config.log_level = wp.LOG_ERROR  # no greeting; Warp's own errors still print
    wp.init()
    if wp.is_cuda_available():
        return None
    driver = wp.get_cuda_driver_version()
    return (f"--backend mjwarp: Warp {wp.config.version} cannot use the GPU that torch sees (CUDA driver: "
            f"{'not found' if driver is None else driver}; warp-lang 1.18 and newer need NVIDIA driver R580 or newer): "
            "update the driver, or train with --no-cuda or --backend envpool")  # fmt: skip


class EnvPoolTasks:
    """EnvPool's MuJoCo tasks on the CPU, seen as Isaac Gym's: float32 tensors on the training device."""

    def __init__(self, args: Args, num_envs: int, seed: int, device: torch.device):
        time_limit = {} if args.max_episode_steps is None else {"max_episode_steps": args.max_episode_steps}
        self.envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **time_limit)
        self.observation_space, self.action_space, self.device = self.envs.observation_space, self.envs.action_space, device

    def reset(self) -> torch.Tensor:
        return torch.as_tensor(self.envs.reset()[0], dtype=torch.float32, device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Next observations, rewards, terminations, truncations."""
        returned = self.envs.step(actions.cpu().numpy())[:4]
        return tuple(torch.as_tensor(x, dtype=torch.float32, device=self.device) for x in returned)


class IsaacGymTasks:
    """IsaacGymEnvs' tasks: observations and rewards stay tensors on the training device (untested: no Isaac Gym here).
    Under torchrun, each process simulates its share of the envs on its own GPU (cuda:LOCAL_RANK)."""

    def __init__(self, args: Args, num_envs: int, seed: int, device: torch.device):
        import isaacgymenvs  # noqa: PLC0415 - only with Isaac Gym

        sim_device, graphics_device = (str(device), device.index) if device.type == "cuda" else ("cpu", -1)
        self.envs = isaacgymenvs.make(seed=seed, task=args.env_id, num_envs=num_envs, sim_device=sim_device,
                                      rl_device=str(device), graphics_device_id=graphics_device, headless=True)  # fmt: skip
        self.observation_space, self.action_space = self.envs.observation_space, self.envs.action_space

    def reset(self) -> torch.Tensor:
        return self.envs.reset()["obs"].float()

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        obs, reward, dones, extras = self.envs.step(actions)
        truncated = extras["time_outs"].float()  # time-limit resets; the other dones are terminations
        return obs["obs"].float(), reward.float(), dones.float() * (1.0 - truncated), truncated


if __name__ == "__main__":
    main()
