"""PPO-EWMA on Atari (EnvPool, gymnasium API) with the metrics of Mayor et al. (ICML 2025).

    python ppo_ewma_atari.py --env-id Breakout-v5 --ewma-com 8

PPO-EWMA (Hilton et al. 2022, "Batch size-invariance for policy optimization"; Beukman et al. 2026
Sec. 2.2, eq. 4) decouples PPO's two uses of the behaviour policy: the behaviour policy still corrects
for off-policyness (importance weight pi_prox / pi_behavior), but the clipping regularises towards a
*proximal* policy, an exponentially weighted moving average of the weights over optimizer steps whose
centre of mass (`--ewma-com`) sets how old the reference is, independently of how the data was collected.
Everything else is ppo_atari_envpool.py (same defaults, flags, tags, metrics, checkpoints, `--resume`
and torchrun, `--schedule`, `--target-ddr`), plus `metrics/kl_prox` and `--adapt ewma-com` (the DDR sets the centre of mass).
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import re
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from types import SimpleNamespace
from typing import Literal

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
    capture_video: bool = False
    """after training, record one evaluation game of the final policy to runs/.../videos/"""
    runs_dir: str = "runs"
    """folder that holds the run directories"""
    save_model: bool = False
    """save the final model to runs/.../{exp_name}.cleanrl_model"""
    checkpoint_interval: int = 0
    """write runs/.../checkpoint.pt every this many iterations (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from (its run's flags are used)"""
    # Speed (none of these changes what is learned, up to float rounding)
    torch_threads: int | None = None
    """torch's CPU threads (default: torch's own, one per core); sweeps/launch.sh gives each of JOBS runs cores / JOBS"""
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
    schedule: str | None = None
    """N_envs x N_RO by fraction of the budget instead, e.g. 0:8x128,0.5:32x32,0.8:128x8 (each phase a new EnvPool pool)"""
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
    target_ddr: float | None = None
    """adapt --clip-coef (or --ewma-com: --adapt) every iteration so that the DDR, batch / KL, tracks this (Beukman 2026)"""
    target_ddr_final: float | None = None
    """with --target-ddr: the target grows geometrically to this value by the end of training (Beukman: DDR must increase)"""
    adapt_rate: float = 0.1
    """with --target-ddr: clip_coef *= (DDR / target) ** adapt_rate after every iteration (ewma_com: ** -adapt_rate)"""
    adapt: Literal["clip-coef", "ewma-com"] = "clip-coef"
    """with --target-ddr: what follows the DDR: the clip epsilon, or the proximal's centre of mass (older: smaller step)"""
    clip_coef_bounds: tuple[float, float] = (0.01, 0.5)
    """with --target-ddr: the adapted clip_coef stays in [low, high]"""
    ewma_com_bounds: tuple[float, float] = (0.5, 512.0)
    """with --target-ddr --adapt ewma-com: the adapted ewma_com stays in [low, high]"""
    ddr_batch: int = 512
    """with --target-ddr: states for the KL of the iterations without metrics (those use the metrics batch)"""
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
    phases: tyro.conf.Suppress[list] = field(default_factory=list)  # (first step, N_envs, N_RO) of each phase
    batch_size: tyro.conf.Suppress[int] = 0  # of the first phase
    num_iterations: tyro.conf.Suppress[int] = 0
    planned_steps: tyro.conf.Suppress[int] = 0  # steps of the num_iterations full batches that fit the budget


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def nature_cnn() -> nn.Sequential:
    """Mnih et al. 2015 encoder: 3 convolutions (32, 64, 64) and a 512-unit dense layer."""
    return nn.Sequential(
        layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
        nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
    )  # fmt: skip


class Agent(nn.Module):
    def __init__(self, num_actions: int, separate_networks: bool, channels_last: bool = True):
        super().__init__()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.actor_encoder = nature_cnn()
        self.critic_encoder = nature_cnn() if separate_networks else None
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate features (actor, critic); uint8 pixels are scaled here (in place), after the (4x smaller)
        layout change."""
        x = obs.contiguous(memory_format=self.memory_format).float().div_(255.0)
        actor_features = self.actor_encoder(x)
        return actor_features, actor_features if self.critic_encoder is None else self.critic_encoder(x)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)[1]).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        actor_features, critic_features = self.features(obs)
        logits = self.actor(actor_features)
        distribution = Categorical(logits=logits, validate_args=False)  # validation waits for the GPU (bool of a tensor)
        action = sample_actions(logits) if action is None else action
        return action, distribution.log_prob(action), distribution.entropy(), self.critic(critic_features).squeeze(-1), logits


# Copied from ppo_atari_envpool.sample_actions
def sample_actions(logits: torch.Tensor) -> torch.Tensor:
    """One action per row of (B, A) logits, drawn from softmax(logits) by the Gumbel-max trick: argmax(logits + G),
    G = -log(E), E ~ Exp(1). Categorical.sample's torch.multinomial checks its input on the host on CUDA; this never waits."""
    noise = torch.empty_like(logits).exponential_().clamp_(min=torch.finfo(logits.dtype).tiny)  # a 0 would always win
    return (logits - noise.log()).argmax(dim=-1)


@torch.no_grad()
def measure_agent(agent: Agent, obs: torch.Tensor, actions: torch.Tensor, behavior_logits: torch.Tensor, batch_size: int,
                  dormant_tau: float, proximal: Agent) -> dict[str, float]:  # fmt: skip
    """The metrics/ tags that need a forward pass, after the update, on the metrics batch:
    ratios and KL compare the updated policy with the policy that collected the rollout;
    kl_prox, the outer step, with the proximal policy it is clipped towards."""
    with metrics.hidden_activations(agent) as activations:  # every hidden post-ReLU output, for the dormant neurons
        actor_features, critic_features = agent.features(obs)
    logits = agent.actor(actor_features)
    measured = {
        "feature_rank": metrics.feature_rank(actor_features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_tau),
        "weight_norm": metrics.weight_norm(agent.parameters()),
        # ess_pct, policy_variance, kl_behavior and ddr: the updated policy against the one that collected the rollout
        **metrics.categorical_policy_change(logits, behavior_logits, actions, batch_size),
        "kl_prox": metrics.categorical_kl(proximal.actor(proximal.features(obs)[0]), logits).mean().item(),
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
    return 1.0 - previous_done


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


def ppo_ewma_loss(new_logprob, proximal_logprob, new_value, entropy, minibatch: dict[str, torch.Tensor], *, clip_coef: float,
                  clip_vloss: bool, ent_coef: float, vf_coef: float, norm_adv: bool,
                  importance_weight_cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """Decoupled clipped objective (Beukman et al. 2026 eq. 4): (pi_prox / pi_behavior) * min(r A, clip(r, 1 - eps, 1 + eps) A)
    with r = pi_theta / pi_prox; the importance weight is a capped constant. With pi_prox = pi_behavior this is PPO's loss.
    `minibatch` holds the rollout's logprobs (behaviour), values, advantages, returns and valid (the reset-step mask)."""
    mask, advantages, returns, old_value = (minibatch[k] for k in ("valid", "advantages", "returns", "values"))
    count = minibatch["valid_count"]
    if norm_adv:
        advantages = (advantages - minibatch["advantage_mean"]) / (minibatch["advantage_std"] + 1e-8)
    importance_weight = (proximal_logprob - minibatch["logprobs"]).exp().clamp(max=importance_weight_cap).detach()
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
    log_ratio = new_logprob - minibatch["logprobs"]  # approx KL from the behaviour policy, as PPO logs it
    stats = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy_loss,
             "approx_kl": masked_mean((log_ratio.exp() - 1) - log_ratio, mask, count),  # Schulman's k3 estimator
             "clipfrac": masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask, count)}  # fmt: skip
    return loss, {name: value.detach() for name, value in stats.items()}


def minibatch_backward(agent: Agent, proximal: Agent, minibatch: dict[str, torch.Tensor], args: Args,
                       clip_coef: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
    """Forward passes (agent; proximal network, not differentiated), PPO-EWMA loss and backward pass of one minibatch
    (one compiled graph with --compile); the loss statistics. clip_coef comes as a tensor: --target-ddr changes it
    every iteration, which would recompile a graph that held a float."""
    _, new_logprob, entropy, new_value, _ = agent.get_action_and_value(minibatch["obs"], minibatch["actions"])
    with torch.no_grad():
        proximal_logprob = proximal.get_action_and_value(minibatch["obs"], minibatch["actions"])[1]
    loss, stats = ppo_ewma_loss(new_logprob, proximal_logprob, new_value, entropy, minibatch, clip_coef=clip_coef,
                                clip_vloss=args.clip_vloss, ent_coef=args.ent_coef, vf_coef=args.vf_coef,
                                norm_adv=args.norm_adv, importance_weight_cap=args.importance_weight_cap)  # fmt: skip
    loss.backward()
    return stats


@torch.no_grad()
def ewma_update(proximal: nn.Module, current: nn.Module, weight_sum: float, beta: float) -> float:
    """One bias-corrected EWMA step: W' = beta W + 1; theta_prox <- theta_prox * (beta W / W') + theta / W'; returns W'.
    theta_prox is then the beta-discounted average of every weight vector seen so far, the initial one included
    (W = 1 at the start), so there is no start-up bias. Deterministic: under torchrun the processes' identical weights
    keep their proximal weights identical, with no communication."""
    new_weight_sum = beta * weight_sum + 1.0
    for proximal_tensor, tensor in zip(proximal.state_dict().values(), current.state_dict().values(), strict=True):
        proximal_tensor.lerp_(tensor, 1.0 / new_weight_sum)  # the same sum: beta W / W' = 1 - 1 / W
    return new_weight_sum


def adapted_step_size(value: float, ddr: float, target: float, rate: float, bounds: tuple, sign: int = 1) -> float:
    """One step in log space towards the target data-to-divergence ratio: value * (DDR / target) ** (sign * rate), kept
    in bounds. sign +1 for a clipping epsilon (a larger epsilon, a larger KL, a smaller DDR): a DDR under the target
    shrinks it; sign -1 for the EWMA's centre of mass (a larger one, an older proximal policy, a smaller KL): a DDR
    under the target raises it."""
    return min(max(value * (ddr / target) ** (sign * rate), bounds[0]), bounds[1])


@torch.no_grad()
def behavior_kl(agent: Agent, obs: torch.Tensor, behavior_logits: torch.Tensor) -> float:
    """KL(behaviour policy || updated policy), the mean over the states: the divergence of the DDR."""
    return metrics.categorical_kl(behavior_logits, agent.actor(agent.features(obs)[0])).mean().item()


def target_ddr(args: Args, step: int) -> float:
    """--target-ddr, grown geometrically to --target-ddr-final (when given) over the planned steps."""
    growth = args.target_ddr_final / args.target_ddr if args.target_ddr_final else 1.0
    return args.target_ddr * growth ** (step / args.planned_steps)


def phase_at(args: Args, step: int) -> tuple[int, int, int]:
    """N_envs, N_RO and the minibatch size (all processes together) of the phase that `step` falls in: a fixed
    --minibatch-size stays, else the number of minibatches does."""
    _, num_envs, num_steps = [phase for phase in args.phases if phase[0] <= step][-1]
    return num_envs, num_steps, args.minibatch_size or num_envs * num_steps // args.num_minibatches


def learning_rate(args: Args, num_envs: int, step: int) -> float:
    """--learning-rate scaled for N_envs by --lr-scaling (paper Fig. 11), annealed linearly to 0 over the planned steps."""
    k = num_envs / args.lr_reference_envs
    scaled = args.learning_rate * {"none": 1, "sqrt": k**0.5, "linear": k, "inverse": 1 / k}[args.lr_scaling]
    return scaled * (1 - step / args.planned_steps) if args.anneal_lr else scaled


def main() -> None:
    args, checkpoint = parse_args()
    run_dir, writer, progress, stop_signal = start_run(args, checkpoint)
    device = torch.device(f"cuda:{LOCAL_RANK}" if args.cuda and torch.cuda.is_available() else "cpu")

    num_actions = envpool.make_spec(args.env_id).action_space.n
    agent = Agent(num_actions, args.separate_networks, args.channels_last).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=args.fused_adam)
    act, backward = agent.get_action_and_value, minibatch_backward
    if args.compile:  # the same functions as compiled graphs; with --cudagraphs, replayed as CUDA graphs
        torch._inductor.config.fallback_random = True  # the eager path's random numbers: a seed draws the same actions
        act, backward = (torch.compile(f, mode="reduce-overhead" if args.cudagraphs else None) for f in (act, backward))
    # The proximal policy (no gradients: only ewma_update moves it) starts at the initial weights (W = 1), never reset.
    proximal = copy.deepcopy(agent).requires_grad_(False)
    ewma_beta, ewma_weight_sum = args.ewma_com / (args.ewma_com + 1), checkpoint["ewma_weight_sum"] if checkpoint else 1.0
    state = {"model": agent, "optimizer": optimizer, "proximal": proximal}  # what a checkpoint holds, with the weight sum
    global_step = restore_checkpoint(checkpoint, **state) if checkpoint else 0
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    if WORLD_SIZE > 1:  # the same initial weights everywhere, but each process its own action noise
        torch.manual_seed(hash((args.seed, RANK, start_iteration)))

    # Full-game statistics: EnvPool's episodic_life ends an "episode" per life, but the score
    # that matters is the whole game (info["terminated"] marks the real game over).
    finished_games: list[tuple[int, float, int]] = []  # (global step, return, length)
    recent_returns: deque[float] = deque(maxlen=20)
    embeddings: list[dict[str, np.ndarray]] = []
    start_time, start_step, phase, iteration = time.time(), global_step, None, start_iteration - 1

    for iteration in range(start_iteration, args.num_iterations + 1):
        if phase_at(args, global_step) != phase:  # EnvPool cannot resize a pool: a new phase plays new games in a new pool
            phase = phase_at(args, global_step)  # N_envs, N_RO, minibatch size
            batch_size, num_steps = phase[0] * phase[1], phase[1]
            # Under torchrun each process steps its share of the envs and updates on its share of each minibatch.
            num_envs, minibatch_size = phase[0] // WORLD_SIZE, phase[2] // WORLD_SIZE
            # A resumed run or a new phase starts new games from another env seed: EnvPool's state cannot be saved.
            seed = args.seed + iteration - 1 + RANK * num_envs
            envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=num_envs, seed=seed,
                                max_episode_steps=args.max_episode_steps, episodic_life=True, reward_clip=True)  # fmt: skip
            # Rollout storage on the training device (a variant adds a field in one line); pixels stay uint8 until the network.
            size = (num_steps, num_envs)
            # Frames laid out as the network reads them (NHWC with --channels-last): the flattened batch is a view, not a copy.
            frames = torch.empty((size[0] * size[1], *envs.observation_space.shape), dtype=torch.uint8, device=device,
                                 memory_format=agent.memory_format)  # fmt: skip
            rollout = {"obs": frames.zero_().unflatten(0, size),
                       "actions": torch.zeros(size, dtype=torch.long, device=device),
                       "logits": torch.zeros(size + (num_actions,), device=device),
                       "logprobs": torch.zeros(size, device=device), "values": torch.zeros(size, device=device)}  # fmt: skip
            # What EnvPool returns stays on the host until the rollout ends: one copy to the device per rollout, not per step.
            host = {name: np.zeros(size, dtype=np.float32) for name in ("rewards", "terminations", "truncations", "valid")}
            next_obs = torch.tensor(envs.reset()[0], device=device)
            # EnvPool's frames pass through page-locked memory on CUDA, from where the copy to the GPU runs asynchronously.
            host_obs = torch.empty_like(next_obs, device="cpu").pin_memory() if device.type == "cuda" else next_obs
            next_done, game_return = np.zeros(num_envs, dtype=np.float32), np.zeros(num_envs)
        optimizer.param_groups[0]["lr"] = learning_rate(args, phase[0], global_step)

        rollout_start_step = global_step
        for step in range(num_steps):
            global_step += phase[0]
            rollout["obs"][step] = next_obs
            host["valid"][step] = reset_step_mask(next_done)
            with torch.inference_mode():
                action, logprob, _, value, logits = act(next_obs)
            rollout["actions"][step], rollout["logprobs"][step] = action, logprob
            rollout["values"][step], rollout["logits"][step] = value, logits

            next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())  # the step's one sync
            host_obs.copy_(torch.from_numpy(next_obs_np))  # free again: the last sync waited for the forward pass that read it
            next_obs.copy_(host_obs, non_blocking=True)  # a no-op on the CPU, where host_obs is next_obs
            host["rewards"][step], host["terminations"][step], host["truncations"][step] = reward, terminations, truncations
            next_done = np.maximum(terminations, truncations).astype(np.float32)

            game_return += info["reward"]  # unclipped reward; 0 on reset steps
            game_over = info["terminated"].astype(bool) | truncations
            for finished in zip(game_return[game_over], info["elapsed_step"][game_over], strict=True):
                finished_games.append((global_step, *finished))
            game_return[game_over] = 0.0
        if stop_requested(stop_signal):  # checked once a rollout: the same answer in every process
            global_step = rollout_start_step  # the interrupted rollout is discarded
            break
        for step, finished_return, finished_length in all_ranks_list(finished_games):
            writer.add_scalar("charts/episodic_return", finished_return, step)
            writer.add_scalar("charts/episodic_length", finished_length, step)
            recent_returns.append(finished_return)
        finished_games.clear()
        rollout |= {name: torch.as_tensor(values, device=device) for name, values in host.items()}  # on the CPU: no copy

        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            rollout["advantages"], rollout["returns"] = compute_gae(
                rollout["rewards"], rollout["values"], rollout["terminations"], rollout["truncations"],
                rollout["valid"], next_value, args.gamma, args.gae_lambda)  # fmt: skip
        batch = {name: values.flatten(0, 1) for name, values in rollout.items()}

        measure = args.metrics_interval > 0 and (iteration % args.metrics_interval == 0 or iteration == args.num_iterations)
        grad_norms, minibatch_stats, gradient_kurtosis, clip_coef = [], [], None, torch.tensor(args.clip_coef, device=device)
        for _epoch in range(args.update_epochs):
            permutation = torch.randperm(len(batch["obs"]), device=device)
            for start in range(0, len(batch["obs"]), minibatch_size):
                minibatch = {name: values[permutation[start : start + minibatch_size]] for name, values in batch.items()}
                minibatch |= minibatch_statistics(minibatch)  # outside the compiled update: it holds the collective
                optimizer.zero_grad()
                # .clone(): a CUDA graph overwrites its outputs at its next replay
                stats = {name: value.clone() for name, value in backward(agent, proximal, minibatch, args, clip_coef).items()}
                all_ranks_sum_gradients(agent.parameters())
                if measure and gradient_kurtosis is None:
                    gradient_kurtosis = metrics.gradient_kurtosis(p.grad for p in agent.parameters() if p.grad is not None)
                grad_norms.append(nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm))
                optimizer.step()
                ewma_weight_sum = ewma_update(proximal, agent, ewma_weight_sum, ewma_beta)
                minibatch_stats.append(stats)
            if args.target_kl is not None and all_ranks_sum(stats["approx_kl"]) > args.target_kl:
                break

        valid = batch["valid"].bool()
        charts = {"learning_rate": optimizer.param_groups[0]["lr"], "num_envs": phase[0], "num_steps": num_steps,
                  "batch_size": batch_size, "clip_coef": args.clip_coef, "ewma_com": args.ewma_com}  # fmt: skip
        losses = {name: all_ranks_sum(torch.stack([s[name] for s in minibatch_stats]).mean()) for name in minibatch_stats[0]}
        losses["explained_variance"] = metrics.explained_variance(batch["values"][valid], batch["returns"][valid])
        measured = {}
        if measure or args.target_ddr:
            valid_index = torch.nonzero(valid).squeeze(1)
            sample = valid_index[torch.randperm(valid_index.numel(), device=device)[: args.metrics_batch]]
        if measure:
            measured = measure_agent(agent, batch["obs"][sample], batch["actions"][sample], batch["logits"][sample],
                                     batch_size, args.dormant_tau, proximal)  # fmt: skip
            measured |= {"grad_kurtosis": gradient_kurtosis, "grad_norm": torch.stack(grad_norms).mean().item()}
            if args.save_embeddings and RANK == 0:
                embeddings.append(embed(agent, batch["obs"][sample[: args.embeddings_per_iteration]], iteration, global_step))
        if args.target_ddr:  # the outer step follows the DDR of this update, the same in every process
            small = sample[: args.ddr_batch]  # used on the iterations without metrics
            kl = measured["kl_behavior"] if measure else behavior_kl(agent, batch["obs"][small], batch["logits"][small])
            measured["ddr"] = metrics.data_to_divergence_ratio(batch_size, float(all_ranks_sum(torch.tensor(kl))) / WORLD_SIZE)
            ddr, target = measured["ddr"], target_ddr(args, global_step)
            if args.adapt == "clip-coef":
                args.clip_coef = adapted_step_size(args.clip_coef, ddr, target, args.adapt_rate, args.clip_coef_bounds)
            else:  # the EWMA weight sum stays: only the discount of the steps to come changes
                args.ewma_com = adapted_step_size(args.ewma_com, ddr, target, args.adapt_rate, args.ewma_com_bounds, sign=-1)
                ewma_beta = args.ewma_com / (args.ewma_com + 1)
        charts["SPS"] = int((global_step - start_step) / (time.time() - start_time))  # after the metrics: their cost counts
        for group, scalars in {"charts": charts, "losses": losses, "metrics": measured}.items():
            for name, value in scalars.items():
                writer.add_scalar(f"{group}/{name}", value, global_step)
        progress.set_postfix(episodic_return=np.mean(recent_returns) if recent_returns else float("nan"), refresh=False)
        progress.update(global_step - progress.n)
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(run_dir, args, iteration, global_step, embeddings, **state, ewma_weight_sum=ewma_weight_sum)

    finish_run(run_dir, writer, progress, args, iteration, global_step, embeddings, stop_signal, **state,
               ewma_weight_sum=ewma_weight_sum)  # fmt: skip


# ---- Plumbing, not part of the algorithm: flags, run directory, checkpoints, progress, video ----
# (every script of the project has its own copy of this part)
def fail(message: str) -> None:
    """A usage error: one line and exit status 2, as argparse and tyro do."""
    sys.stderr.write(f"error: {message}\n")  # one write: the lines of torchrun's processes do not interleave
    sys.exit(2)


def parse_args() -> tuple[Args, dict | None]:
    """The validated flags and, with --resume, the checkpoint (whose flags replace most of the command line's)."""
    args, checkpoint = tyro.cli(Args), None
    # Flags that say how to run, not what to learn: on --resume only these come from the command line.
    runtime = ("cuda", "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model", "checkpoint_interval",
               "torch_threads", "channels_last", "fused_adam", "reuse_host_memory", "compile", "cudagraphs")  # fmt: skip
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


def parse_schedule(text: str) -> list[tuple[float, int, int]]:
    """'0:8x128,0.5:32x32' -> [(0.0, 8, 128), (0.5, 32, 32)]: from that fraction of the budget on, N_envs x N_RO."""
    phases = [re.fullmatch(r"(0|0?\.\d+):([1-9]\d*)x([1-9]\d*)", part.strip()) for part in text.split(",")]
    starts = [float(phase[1]) for phase in phases if phase]
    if not all(phases) or starts[0] != 0 or starts != sorted(set(starts)):
        fail(f"--schedule {text!r}: write the phases as START:NUM_ENVSxNUM_STEPS, starting at 0 with increasing fractions "
             "of the budget below 1 and sizes > 0, e.g. 0:8x128,0.5:32x32,0.8:128x8")  # fmt: skip
    return [(float(phase[1]), int(phase[2]), int(phase[3])) for phase in phases]


def validate_and_derive(args: Args) -> Args:
    """Check every flag before anything is created (one line, exit 2); fill in the derived values."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    positive = ("total_timesteps", "max_episode_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                "lr_reference_envs", "metrics_batch", "embeddings_per_iteration", "learning_rate", "adam_eps", "clip_coef",
                "max_grad_norm", "importance_weight_cap", "target_kl", "minibatch_size", "torch_threads", "target_ddr",
                "target_ddr_final", "adapt_rate", "ddr_batch")  # fmt: skip
    non_negative = ("checkpoint_interval", "metrics_interval", "ent_coef", "vf_coef", "dormant_tau", "ewma_com")
    value = lambda name: getattr(args, name)  # noqa: E731
    checks = [(value(name) is None or value(name) > 0, f"{flag(name)} must be > 0, got {value(name)}") for name in positive]
    checks += [(getattr(args, name) >= 0, f"{flag(name)} must be >= 0, got {getattr(args, name)}") for name in non_negative]
    phases = parse_schedule(args.schedule) if args.schedule else [(0.0, args.num_envs, args.num_steps)]
    split = f"--minibatch-size {args.minibatch_size}" if args.minibatch_size else f"--num-minibatches {args.num_minibatches}"
    for _, num_envs, num_steps in phases:
        batch_size = num_envs * num_steps
        minibatch_size = args.minibatch_size or batch_size // max(args.num_minibatches, 1)
        checks += [
            (minibatch_size > 0 and batch_size % minibatch_size == 0,
             f"{split} does not divide the batch (num_envs * num_steps = {batch_size}) into equal minibatches"),
            (num_envs % WORLD_SIZE == 0 and minibatch_size % WORLD_SIZE == 0,
             f"--num-envs {num_envs} and the minibatch size {minibatch_size} must split evenly over {WORLD_SIZE} processes"),
        ]  # fmt: skip
    checks += [
        (0 <= args.gamma <= 1, f"--gamma must be in [0, 1], got {args.gamma}"),
        (0 <= args.gae_lambda <= 1, f"--gae-lambda must be in [0, 1], got {args.gae_lambda}"),
        (0 < args.clip_coef_bounds[0] <= args.clip_coef_bounds[1],
         f"--clip-coef-bounds {args.clip_coef_bounds} is not 0 < low <= high"),
        (0 < args.ewma_com_bounds[0] <= args.ewma_com_bounds[1],
         f"--ewma-com-bounds {args.ewma_com_bounds} is not 0 < low <= high"),
        (not args.cudagraphs or (args.compile and args.cuda and torch.cuda.is_available()),
         "--cudagraphs needs --compile and CUDA"),
        (envpool.registration.registry.specs.get(args.env_id, (0, 0))[1] == "AtariEnvSpec",  # (module, spec class, ...)
         f"--env-id {args.env_id!r} is not an EnvPool Atari task (e.g. Breakout-v5, Pong-v5, Qbert-v5)"),
        (args.total_timesteps >= phases[0][1] * phases[0][2],
         f"--total-timesteps {args.total_timesteps} is smaller than one batch "
         f"(num_envs * num_steps = {phases[0][1] * phases[0][2]})"),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            fail(message)
    args.phases = [(int(start * args.total_timesteps), num_envs, num_steps) for start, num_envs, num_steps in phases]
    args.num_envs, args.num_steps = phases[0][1:]
    args.batch_size, args.planned_steps, args.num_iterations = args.num_envs * args.num_steps, 0, 0
    batch_at = lambda step: phase_at(args, step)[0] * phase_at(args, step)[1]  # noqa: E731
    while args.planned_steps + batch_at(args.planned_steps) <= args.total_timesteps:  # the full batches that fit the budget
        args.planned_steps, args.num_iterations = args.planned_steps + batch_at(args.planned_steps), args.num_iterations + 1
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
    """checkpoint.pt (state dicts, plain values such as the EWMA weight sum, counters, RNG states: tensors and plain
    data for weights_only) and the new embeddings, each written to a temporary file and renamed: a crash never
    leaves half a file. Process 0 only."""
    if modules and RANK == 0:
        # The training device's generator only: the run may resume on a machine with fewer GPUs.
        rng = {"torch": torch.get_rng_state(), "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else []}
        state = {name: module.state_dict() if hasattr(module, "state_dict") else module for name, module in modules.items()}
        state |= {"args": asdict(args), "rng": rng}
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
    """Load the state dicts and the RNG state of a checkpoint (main reads its plain values); returns its global step."""
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


def finish_run(run_dir, writer, progress, args, iteration, global_step, embeddings, stop_signal, **modules) -> None:
    """Interrupted: save a checkpoint and exit 128 + signal. Finished: the last checkpoint (with --checkpoint-interval),
    embeddings, model and video, then done.json (the completion marker that sweeps/launch.sh looks for)."""
    progress.close()
    writer.close()
    interrupted = bool(stop_signal) and global_step < args.planned_steps
    iteration -= interrupted  # the interrupted rollout is not counted
    checkpointed = modules if interrupted or args.checkpoint_interval else {}  # else only the embeddings
    save_checkpoint(run_dir, args, iteration, global_step, embeddings, **checkpointed)
    if dist.is_initialized():  # the summed gradients keep every process's weights (and so proximal ones) identical
        state = [*modules["model"].parameters(), *modules["proximal"].parameters()]
        gathered = all_ranks_list([torch.cat([tensor.detach().flatten() for tensor in state]).cpu()])
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
    if args.save_model:
        path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        torch.save(modules["model"].state_dict(), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    if args.capture_video:
        record_video(modules["model"], args, run_dir)
    with open(os.path.join(run_dir, "done.json"), "w") as f:
        json.dump({"global_step": global_step, "iterations": iteration}, f)


@torch.no_grad()
def record_video(agent: Agent, args: Args, run_dir: str) -> None:
    """One game of the final policy in EnvPool's Atari (the training preprocessing), rendered to MP4."""
    from moviepy import ImageSequenceClip  # noqa: PLC0415 - only needed here

    env = envpool.make(args.env_id, env_type="gymnasium", num_envs=1, seed=args.seed, max_episode_steps=args.max_episode_steps,
                       episodic_life=True, reward_clip=True, render_mode="rgb_array")  # fmt: skip
    obs, frames, game_return, game_over = env.reset()[0], [], 0.0, False
    agent.cpu()  # training is over
    while not game_over:
        frames.append(env.render()[0])
        obs, _, _, truncated, info = env.step(agent.get_action_and_value(torch.as_tensor(obs))[0].numpy())
        game_return += info["reward"][0]
        game_over = info["terminated"][0] or truncated[0]
    path = os.path.join(run_dir, "videos", "eval.mp4")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ImageSequenceClip(frames, fps=15).write_videofile(path, logger=None)  # 15 agent steps = 60 frames = 1 s
    print(f"video of one evaluation game (return {game_return:g}): {path}")


if __name__ == "__main__":
    main()
