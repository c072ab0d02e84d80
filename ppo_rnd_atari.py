"""PPO + Random Network Distillation on hard-exploration Atari (EnvPool, gymnasium API).

    python ppo_rnd_atari.py --env-id MontezumaRevenge-v5 --num-envs 128 --num-steps 128

Burda et al. 2019, "Exploration by Random Network Distillation", with CleanRL's RND reference settings
(sticky actions, 128 envs x 128 steps, gamma_ext 0.999, gamma_int 0.99, ext/int advantage coefficients 2/1,
predictor trained on 25 % of each minibatch), on top of `ppo_atari_envpool.py` (EnvPool's reset step masked
out of everything, the metrics, `--separate-networks`, `--minibatch-size`, `--lr-scaling`, checkpoints, `--resume`):
- a frozen random target network and a trained predictor see the last frame of the next observation,
  normalised by a running mean/std of observations (warmed up with random actions before training) and
  clipped to [-5, 5]; the intrinsic reward is the predictor's mean squared error, divided by the running std
  of the discounted intrinsic return; checkpoints hold both running statistics;
- the policy/value network has two value heads; extrinsic GAE is episodic (as in PPO), intrinsic GAE is
  non-episodic (it runs on through episode ends).
"""

from __future__ import annotations

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
import tyro
from torch import nn
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import metrics


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
    """save the final policy/value network to runs/.../{exp_name}.cleanrl_model"""
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


FRAME_SHAPE = (1, 84, 84)  # RND sees the last frame of the stacked observation


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
    """Nature-CNN policy with an extrinsic and an intrinsic value head."""

    def __init__(self, num_actions: int, separate_networks: bool, channels_last: bool = True):
        super().__init__()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.actor_encoder = nature_cnn()
        self.critic_encoder = nature_cnn() if separate_networks else None
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic_ext = layer_init(nn.Linear(512, 1), std=1)
        self.critic_int = layer_init(nn.Linear(512, 1), std=1)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate features (actor, critic); uint8 pixels are scaled here (in place), after the (4x smaller)
        layout change."""
        x = obs.contiguous(memory_format=self.memory_format).float().div_(255.0)
        actor_features = self.actor_encoder(x)
        return actor_features, actor_features if self.critic_encoder is None else self.critic_encoder(x)

    def values(self, critic_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(extrinsic value, intrinsic value)"""
        return self.critic_ext(critic_features).squeeze(-1), self.critic_int(critic_features).squeeze(-1)

    def get_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.values(self.features(obs)[1])

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """action, log-probability, entropy, extrinsic value, intrinsic value, logits"""
        actor_features, critic_features = self.features(obs)
        logits = self.actor(actor_features)
        distribution = Categorical(logits=logits, validate_args=False)  # validation waits for the GPU (bool of a tensor)
        action = sample_actions(logits) if action is None else action
        return action, distribution.log_prob(action), distribution.entropy(), *self.values(critic_features), logits


def rnd_convolutions() -> list[nn.Module]:
    """Burda et al.'s RND encoder on one 84x84 frame: Nature-CNN convolutions with leaky ReLUs."""
    return [layer_init(nn.Conv2d(1, 32, 8, stride=4)), nn.LeakyReLU(), layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.LeakyReLU(), layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.LeakyReLU(), nn.Flatten()]  # fmt: skip


class RNDModel(nn.Module):
    """A random, frozen target network and the predictor trained to match it (512 features each)."""

    def __init__(self):
        super().__init__()
        self.target = nn.Sequential(*rnd_convolutions(), layer_init(nn.Linear(64 * 7 * 7, 512)))
        self.predictor = nn.Sequential(*rnd_convolutions(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
                                       layer_init(nn.Linear(512, 512)), nn.ReLU(),
                                       layer_init(nn.Linear(512, 512)))  # fmt: skip
        self.target.requires_grad_(False)

    def forward(self, normalised_frames: torch.Tensor) -> torch.Tensor:
        """Per-frame mean squared error of the predictor's features, on normalised (B, 1, 84, 84) frames: the raw
        intrinsic reward, and the predictor's loss (the frozen target gets no gradient)."""
        return (self.predictor(normalised_frames) - self.target(normalised_frames)).square().mean(dim=-1)


class RunningMeanStd(nn.Module):
    """Running mean and population variance of a stream of (B, *shape) batches. Buffers, so that they
    follow the networks to the training device and into the checkpoint."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor, chunk_size: int = 4096) -> None:
        """Chan et al.'s parallel update, chunk by chunk to bound the float copies of uint8 frames."""
        for chunk in batch.split(chunk_size) if len(batch) else ():  # a step where every env resets has no frame
            var, mean = (moment.double() for moment in torch.var_mean(chunk.float(), dim=0, correction=0))
            n, delta = len(chunk), mean - self.mean
            total = self.count + n
            # In place: the compiled update reads these buffers, and --cudagraphs replays them at fixed addresses.
            self.var.copy_((self.var * self.count + var * n + delta.square() * self.count * n / total) / total)
            self.mean.add_(delta * n / total)
            self.count.copy_(total)

    @property
    def std(self) -> torch.Tensor:
        return (self.var + 1e-8).sqrt()


# Copied from ppo_atari_envpool.sample_actions
def sample_actions(logits: torch.Tensor) -> torch.Tensor:
    """One action per row of (B, A) logits, drawn from softmax(logits) by the Gumbel-max trick: argmax(logits + G),
    G = -log(E), E ~ Exp(1). Categorical.sample's torch.multinomial checks its input on the host on CUDA; this never waits."""
    noise = torch.empty_like(logits).exponential_().clamp_(min=torch.finfo(logits.dtype).tiny)  # a 0 would always win
    return (logits - noise.log()).argmax(dim=-1)


@torch.no_grad()
def measure_agent(
    agent: Agent, obs: torch.Tensor, actions: torch.Tensor, behavior_logits: torch.Tensor, batch_size: int, dormant_tau: float
) -> dict[str, float]:
    """The metrics/ tags that need a forward pass, after the update, on the metrics batch, of the policy/value
    network (not the RND networks): ratios and KL compare the updated policy with the one that collected the rollout."""
    with metrics.hidden_activations(agent) as activations:  # every hidden post-ReLU output, for the dormant neurons
        actor_features, critic_features = agent.features(obs)
    measured = {
        "feature_rank": metrics.feature_rank(actor_features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_tau),
        "weight_norm": metrics.weight_norm(agent.parameters()),
        # ess_pct, policy_variance, kl_behavior and ddr: the updated policy against the one that collected the rollout
        **metrics.categorical_policy_change(agent.actor(actor_features), behavior_logits, actions, batch_size),
    }
    if agent.critic_encoder is not None:
        measured["feature_rank_critic"] = metrics.feature_rank(critic_features)
    return measured


@torch.no_grad()
def embed(agent: Agent, obs: torch.Tensor, iteration: int, global_step: int) -> dict[str, np.ndarray]:
    """Penultimate features and both critic values of a few states, for the coverage plots (paper Fig. 2)."""
    features, critic_features = agent.features(obs)
    ext_values, int_values = agent.values(critic_features)
    return {"features": features.cpu().numpy().astype(np.float16), "values": ext_values.cpu().numpy(),
            "int_values": int_values.cpu().numpy(), "iteration": np.full(len(obs), iteration),
            "global_step": np.full(len(obs), global_step)}  # fmt: skip


# ---- The maths of one iteration: small functions that a test can call on hand-made tensors ----
def reset_step_mask(previous_done: torch.Tensor) -> torch.Tensor:
    """1.0 for real transitions, 0.0 for EnvPool's reset steps: after an episode ends, EnvPool's next step
    ignores the action and returns the next episode's first observation with reward 0 (cleanrl issue 475)."""
    return 1.0 - previous_done


def normalise_frames(frames: torch.Tensor, obs_rms: RunningMeanStd) -> torch.Tensor:
    """RND input: (frame - running mean) / running std, clipped to [-5, 5] (Burda et al.)."""
    return ((frames.float() - obs_rms.mean.float()) / obs_rms.std.float()).clamp(-5.0, 5.0)


def reward_forward_filter(rewards, valid, running, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted intrinsic return run forward over a (T, N) rollout from `running` (N,): R_t = gamma R_{t-1} + r_t;
    Burda et al. divide the intrinsic reward by its running std. Never restarted (non-episodic); reset steps
    (valid = 0) leave it unchanged. Returns every R_t and the final state, which carries over to the next rollout."""
    filtered = torch.zeros_like(rewards)
    for t in range(rewards.shape[0]):
        running = torch.where(valid[t].bool(), gamma * running + rewards[t], running)
        filtered[t] = running
    return filtered, running


def compute_gae(rewards, values, terminations, truncations, valid, next_value, gamma: float, gae_lambda: float):
    """Episodic GAE(lambda) advantages and returns over a (T, N) rollout with reset steps masked (next_value: (N,)).

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


def compute_intrinsic_gae(rewards, values, valid, next_value, gamma: float, gae_lambda: float):
    """Non-episodic GAE(lambda) for the intrinsic reward over a (T, N) rollout (Burda et al.): episode ends do not
    stop it, every transition bootstraps. EnvPool's reset steps (valid = 0) get advantage 0 and are skipped as if
    they did not exist: the transition before one bootstraps from, and continues the lambda-chain of, the next real
    state (the new episode's first). The last row bootstraps from `next_value`."""
    advantages = torch.zeros_like(rewards)
    following_value, following_advantage = next_value, torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        advantage = rewards[t] + gamma * following_value - values[t] + gamma * gae_lambda * following_advantage
        real = valid[t].bool()
        advantages[t] = torch.where(real, advantage, torch.zeros_like(advantage))
        following_value = torch.where(real, values[t], following_value)
        following_advantage = torch.where(real, advantage, following_advantage)
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def value_loss(new_value, old_value, returns, mask, clip_coef: float, clip_vloss: bool) -> torch.Tensor:
    """0.5 * squared error to the returns, pessimistically clipped around the old values (PPO)."""
    value_error = (new_value - returns).square()
    if clip_vloss:
        clipped_value = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        value_error = torch.max(value_error, (clipped_value - returns).square())
    return 0.5 * masked_mean(value_error, mask)


def ppo_rnd_loss(new_logprob, new_ext_value, new_int_value, entropy, prediction_error, minibatch: dict[str, torch.Tensor],
                 *, clip_coef: float, clip_vloss: bool, ent_coef: float, vf_coef: float,
                 norm_adv: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """PPO's clipped objective on the combined advantage (ext_coef * A_ext + int_coef * A_int), plus the sum of the
    extrinsic and intrinsic value losses, plus the predictor loss: the mean prediction error over the states with
    rnd_mask 1 (a random `update_proportion` of the minibatch). `minibatch` holds the rollout's logprobs, advantages,
    ext_/int_values, ext_/int_returns, valid (the reset-step mask: entries with 0 count nowhere) and rnd_mask."""
    mask, advantages = minibatch["valid"], minibatch["advantages"]
    if norm_adv:
        mean = masked_mean(advantages, mask)
        advantages = (advantages - mean) / (masked_mean((advantages - mean).square(), mask).sqrt() + 1e-8)
    log_ratio = new_logprob - minibatch["logprobs"]
    ratio = log_ratio.exp()
    policy_loss = masked_mean(torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)), mask)
    ext_value_loss = value_loss(new_ext_value, minibatch["ext_values"], minibatch["ext_returns"], mask, clip_coef, clip_vloss)
    int_value_loss = value_loss(new_int_value, minibatch["int_values"], minibatch["int_returns"], mask, clip_coef, clip_vloss)
    entropy_loss = masked_mean(entropy, mask)
    rnd_loss = masked_mean(prediction_error, minibatch["rnd_mask"] * mask)
    loss = policy_loss - ent_coef * entropy_loss + vf_coef * (ext_value_loss + int_value_loss) + rnd_loss
    stats = {"policy_loss": policy_loss, "value_loss": ext_value_loss + int_value_loss, "ext_value_loss": ext_value_loss,
             "int_value_loss": int_value_loss, "entropy": entropy_loss, "rnd_loss": rnd_loss,
             "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),  # Schulman's k3 estimator
             "clipfrac": masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask)}  # fmt: skip
    return loss, {name: value.detach() for name, value in stats.items()}


def minibatch_backward(agent: Agent, rnd: RNDModel, obs_rms: RunningMeanStd, minibatch: dict[str, torch.Tensor],
                       args: Args) -> dict[str, torch.Tensor]:  # fmt: skip
    """Forward passes (policy/value network, RND on the normalised next frames), loss and backward pass of one
    minibatch (one compiled graph with --compile); the loss statistics."""
    _, new_logprob, entropy, new_ext_value, new_int_value, _ = agent.get_action_and_value(
        minibatch["obs"], minibatch["actions"])  # fmt: skip
    prediction_error = rnd(normalise_frames(minibatch["next_frames"], obs_rms))
    loss, stats = ppo_rnd_loss(new_logprob, new_ext_value, new_int_value, entropy, prediction_error, minibatch,
                               clip_coef=args.clip_coef, clip_vloss=args.clip_vloss, ent_coef=args.ent_coef,
                               vf_coef=args.vf_coef, norm_adv=args.norm_adv)  # fmt: skip
    loss.backward()
    return stats


def main() -> None:
    args, checkpoint = parse_args()
    run_dir, writer, progress, stop_signal = start_run(args, checkpoint)
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")

    # A resumed run starts new games from another env seed: EnvPool's emulator state cannot be saved.
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=args.seed + start_iteration - 1,
                        max_episode_steps=args.max_episode_steps, episodic_life=True, reward_clip=True,
                        repeat_action_probability=args.repeat_action_probability)  # fmt: skip
    num_actions = envs.action_space.n
    agent = Agent(num_actions, args.separate_networks, args.channels_last).to(device)
    rnd = RNDModel().to(device)  # one-channel frames: NCHW and NHWC are the same memory
    obs_rms, int_return_rms = RunningMeanStd(FRAME_SHAPE).to(device), RunningMeanStd().to(device)
    trained_parameters = [*agent.parameters(), *rnd.predictor.parameters()]
    optimizer = torch.optim.Adam(trained_parameters, lr=args.scaled_learning_rate, eps=args.adam_eps, fused=args.fused_adam)
    act, backward = agent.get_action_and_value, minibatch_backward
    if args.compile:  # the same functions as compiled graphs; with --cudagraphs, replayed as CUDA graphs
        torch._inductor.config.fallback_random = True  # the eager path's random numbers: a seed draws the same actions
        act, backward = (torch.compile(f, mode="reduce-overhead" if args.cudagraphs else None) for f in (act, backward))
    modules = {"model": agent, "rnd": rnd, "optimizer": optimizer, "obs_rms": obs_rms, "int_return_rms": int_return_rms}
    global_step = restore_checkpoint(checkpoint, **modules) if checkpoint else 0
    # The forward filter's discounted intrinsic returns (non-episodic: they carry over rollouts and resumes).
    int_return_filter = checkpoint["int_return_filter"].to(device) if checkpoint else torch.zeros(args.num_envs, device=device)
    warmup_steps = checkpoint["warmup_steps"] if checkpoint else 0

    def state() -> dict:  # what a checkpoint holds besides the counters
        return modules | {"int_return_filter": int_return_filter, "warmup_steps": warmup_steps}

    # Rollout storage on the training device; pixels stay uint8 until the networks.
    size = (args.num_steps, args.num_envs)
    # Frames laid out as the network reads them (NHWC with --channels-last): the flattened batch is a view, not a copy.
    frames = torch.empty((size[0] * size[1], *envs.observation_space.shape), dtype=torch.uint8, device=device,
                         memory_format=agent.memory_format)  # fmt: skip
    rollout = {"obs": frames.zero_().unflatten(0, size),
               "next_frames": torch.zeros(size + FRAME_SHAPE, dtype=torch.uint8, device=device),  # RND's inputs
               "actions": torch.zeros(size, dtype=torch.long, device=device),
               "logits": torch.zeros(size + (num_actions,), device=device)}  # fmt: skip
    for name in ("logprobs", "ext_values", "int_values", "rnd_errors"):
        rollout[name] = torch.zeros(size, device=device)
    # What EnvPool returns stays on the host until the rollout ends: one copy to the device per rollout, not per step.
    host = {name: np.zeros(size, dtype=np.float32) for name in ("rewards", "terminations", "truncations", "valid")}

    next_obs = torch.tensor(envs.reset()[0], device=device)
    # EnvPool's frames pass through page-locked memory on CUDA, from where the copy to the GPU runs asynchronously.
    host_obs = torch.empty_like(next_obs, device="cpu").pin_memory() if device.type == "cuda" else next_obs
    next_done = np.zeros(args.num_envs, dtype=np.float32)
    # Full-game statistics: EnvPool's episodic_life ends an "episode" per life, but the score
    # that matters is the whole game (info["terminated"] marks the real game over).
    game_return = np.zeros(args.num_envs)
    recent_returns: deque[float] = deque(maxlen=20)
    embeddings: list[dict[str, np.ndarray]] = []

    # Observation-normalisation warm-up (Burda et al.): random actions; only the observation statistics learn, from
    # RND's inputs (the last frame of each real transition's next observation). Not counted in global_step; an
    # interrupted warm-up continues on --resume.
    warmup_total = args.num_iterations_obs_norm_init * args.num_steps
    if warmup_steps < warmup_total:
        print(f"observation-normalisation warm-up: {(warmup_total - warmup_steps) * args.num_envs:,} random-action steps",
              flush=True)  # fmt: skip
    while warmup_steps < warmup_total and not stop_signal:
        next_obs_np, _, terminations, truncations, info = envs.step(torch.randint(num_actions, (args.num_envs,)).numpy())
        host_obs.copy_(torch.from_numpy(next_obs_np))  # free again: the last sync waited for the forward pass that read it
        next_obs.copy_(host_obs, non_blocking=True)  # a no-op on the CPU, where host_obs is next_obs
        obs_rms.update(next_obs[torch.from_numpy(next_done == 0), -1:])
        next_done = np.maximum(terminations, truncations).astype(np.float32)
        game_return += info["reward"]  # the games go on into training: keep their returns right
        game_return[info["terminated"].astype(bool) | truncations] = 0.0
        warmup_steps += 1
    start_time, start_step = time.time(), global_step

    for iteration in range(start_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.scaled_learning_rate * (1 - (iteration - 1) / args.num_iterations)

        rollout_start_step = global_step
        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            host["valid"][step] = reset_step_mask(next_done)
            with torch.inference_mode():
                action, logprob, _, ext_value, int_value, logits = act(next_obs)
            rollout["actions"][step], rollout["logprobs"][step], rollout["logits"][step] = action, logprob, logits
            rollout["ext_values"][step], rollout["int_values"][step] = ext_value, int_value

            next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())  # the step's one sync
            host_obs.copy_(torch.from_numpy(next_obs_np))  # free again: the last sync waited for the forward pass that read it
            next_obs.copy_(host_obs, non_blocking=True)  # a no-op on the CPU, where host_obs is next_obs
            rollout["next_frames"][step] = next_obs[:, -1:]
            with torch.inference_mode():
                rollout["rnd_errors"][step] = rnd(normalise_frames(next_obs[:, -1:], obs_rms))
            host["rewards"][step], host["terminations"][step], host["truncations"][step] = reward, terminations, truncations
            next_done = np.maximum(terminations, truncations).astype(np.float32)

            game_return += info["reward"]  # unclipped reward; 0 on reset steps
            game_over = info["terminated"].astype(bool) | truncations
            for finished_return, finished_length in zip(game_return[game_over], info["elapsed_step"][game_over], strict=True):
                writer.add_scalar("charts/episodic_return", finished_return, global_step)
                writer.add_scalar("charts/episodic_length", finished_length, global_step)
                recent_returns.append(float(finished_return))
            game_return[game_over] = 0.0
        if stop_signal:  # checked once a rollout
            global_step = rollout_start_step  # the interrupted rollout is discarded
            break
        rollout |= {name: torch.as_tensor(values, device=device) for name, values in host.items()}  # on the CPU: no copy

        # Intrinsic reward: prediction error / running std of the discounted intrinsic return.
        real = rollout["valid"].bool()
        raw_int_rewards = rollout["rnd_errors"] * rollout["valid"]
        filtered, int_return_filter = reward_forward_filter(raw_int_rewards, rollout["valid"], int_return_filter,
                                                            args.int_gamma)  # fmt: skip
        int_return_rms.update(filtered[real])
        rollout["int_rewards"] = raw_int_rewards / int_return_rms.std.float()
        obs_rms.update(rollout["next_frames"][real])  # before the update: the predictor's inputs count this rollout

        with torch.no_grad():
            next_ext_value, next_int_value = agent.get_value(next_obs)
            ext_advantages, rollout["ext_returns"] = compute_gae(
                rollout["rewards"], rollout["ext_values"], rollout["terminations"], rollout["truncations"],
                rollout["valid"], next_ext_value, args.gamma, args.gae_lambda)  # fmt: skip
            int_advantages, rollout["int_returns"] = compute_intrinsic_gae(
                rollout["int_rewards"], rollout["int_values"], rollout["valid"], next_int_value, args.int_gamma,
                args.gae_lambda)  # fmt: skip
        rollout["advantages"] = args.ext_coef * ext_advantages + args.int_coef * int_advantages
        batch = {name: values.flatten(0, 1) for name, values in rollout.items()}

        measure = args.metrics_interval > 0 and (iteration % args.metrics_interval == 0 or iteration == args.num_iterations)
        grad_norms, minibatch_stats, gradient_kurtosis = [], [], None
        for _epoch in range(args.update_epochs):
            permutation = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                minibatch = {name: values[permutation[start : start + args.minibatch_size]] for name, values in batch.items()}
                minibatch["rnd_mask"] = (torch.rand(args.minibatch_size, device=device) < args.update_proportion).float()
                optimizer.zero_grad()
                # .clone(): a CUDA graph overwrites its outputs at its next replay
                stats = {name: value.clone() for name, value in backward(agent, rnd, obs_rms, minibatch, args).items()}
                if measure:  # of the policy/value network alone, as in ppo_atari_envpool.py
                    gradients = [p.grad for p in agent.parameters() if p.grad is not None]
                    if gradient_kurtosis is None:
                        gradient_kurtosis = metrics.gradient_kurtosis(gradients)
                    grad_norms.append(metrics.global_grad_norm(gradients))
                nn.utils.clip_grad_norm_(trained_parameters, args.max_grad_norm)
                optimizer.step()
                minibatch_stats.append(stats)
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break

        valid, measured = batch["valid"].bool(), {}
        charts = {"learning_rate": optimizer.param_groups[0]["lr"],
                  "intrinsic_reward": masked_mean(batch["int_rewards"], batch["valid"])}  # fmt: skip
        losses = {name: torch.stack([s[name] for s in minibatch_stats]).mean() for name in minibatch_stats[0]}
        losses["explained_variance"] = metrics.explained_variance(batch["ext_values"][valid], batch["ext_returns"][valid])
        if measure:
            valid_index = torch.nonzero(valid).squeeze(1)
            sample = valid_index[torch.randperm(valid_index.numel(), device=device)[: args.metrics_batch]]
            measured = measure_agent(agent, batch["obs"][sample], batch["actions"][sample], batch["logits"][sample],
                                     args.batch_size, args.dormant_tau)  # fmt: skip
            measured |= {"grad_kurtosis": gradient_kurtosis, "grad_norm": torch.stack(grad_norms).mean().item()}
            if args.save_embeddings:
                embeddings.append(embed(agent, batch["obs"][sample[: args.embeddings_per_iteration]], iteration, global_step))
        charts["SPS"] = int((global_step - start_step) / (time.time() - start_time))  # after the metrics: their cost counts
        for group, scalars in {"charts": charts, "losses": losses, "metrics": measured}.items():
            for name, value in scalars.items():
                writer.add_scalar(f"{group}/{name}", value, global_step)
        progress.set_postfix(episodic_return=np.mean(recent_returns) if recent_returns else float("nan"), refresh=False)
        progress.update(global_step - progress.n)
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(run_dir, args, iteration, global_step, embeddings, **state())

    finish_run(run_dir, writer, progress, args, global_step, embeddings, stop_signal, **state())


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


def validate_and_derive(args: Args) -> Args:
    """Check every flag before anything is created (one line, exit 2); fill in the derived values."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    positive = ("total_timesteps", "max_episode_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                "lr_reference_envs", "metrics_batch", "embeddings_per_iteration", "learning_rate", "adam_eps", "clip_coef",
                "max_grad_norm", "target_kl", "minibatch_size", "torch_threads")  # fmt: skip
    non_negative = ("checkpoint_interval", "metrics_interval", "ent_coef", "vf_coef", "dormant_tau", "ext_coef", "int_coef",
                    "num_iterations_obs_norm_init")  # fmt: skip
    probabilities = ("gamma", "int_gamma", "gae_lambda", "repeat_action_probability")
    args.batch_size = args.num_envs * args.num_steps
    minibatch_size = args.minibatch_size or args.batch_size // max(args.num_minibatches, 1)
    split = f"--minibatch-size {args.minibatch_size}" if args.minibatch_size else f"--num-minibatches {args.num_minibatches}"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # set by torchrun: each process would train the same run on its own
        fail(
            f"ppo_rnd_atari.py runs as one process: start it with python, not torchrun (which would run "
            f"{os.environ['WORLD_SIZE']} identical copies); the PPO scripts split one run over torchrun's processes"
        )
    value = lambda name: getattr(args, name)  # noqa: E731
    checks = [(value(name) is None or value(name) > 0, f"{flag(name)} must be > 0, got {value(name)}") for name in positive]
    checks += [(getattr(args, name) >= 0, f"{flag(name)} must be >= 0, got {getattr(args, name)}") for name in non_negative]
    checks += [(0 <= getattr(args, name) <= 1, f"{flag(name)} must be in [0, 1], got {getattr(args, name)}")
               for name in probabilities]  # fmt: skip
    checks += [
        (0 < args.update_proportion <= 1, f"--update-proportion must be in (0, 1], got {args.update_proportion}"),
        (not args.cudagraphs or (args.compile and args.cuda and torch.cuda.is_available()),
         "--cudagraphs needs --compile and CUDA"),
        (envpool.registration.registry.specs.get(args.env_id, (0, 0))[1] == "AtariEnvSpec",  # (module, spec class, ...)
         f"--env-id {args.env_id!r} is not an EnvPool Atari task (e.g. MontezumaRevenge-v5, Venture-v5, Breakout-v5)"),
        (minibatch_size > 0 and args.batch_size % minibatch_size == 0,
         f"{split} does not divide the batch (num_envs * num_steps = {args.batch_size}) into equal minibatches"),
        (args.total_timesteps >= args.batch_size,
         f"--total-timesteps {args.total_timesteps} is smaller than one batch (num_envs * num_steps = {args.batch_size})"),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            fail(message)
    args.minibatch_size, args.num_minibatches = minibatch_size, args.batch_size // minibatch_size
    args.num_iterations = args.total_timesteps // args.batch_size
    k = args.num_envs / args.lr_reference_envs  # paper Fig. 11
    lr_factor = {"none": 1, "sqrt": k**0.5, "linear": k, "inverse": 1 / k}[args.lr_scaling]
    args.scaled_learning_rate = args.learning_rate * lr_factor
    return args


def start_run(args: Args, checkpoint: dict | None):
    """Seed torch; the run directory (the checkpoint's on --resume) with args.json, TensorBoard, W&B;
    SIGTERM (Slurm pre-emption) and SIGINT (Ctrl-C) land in `stop_signal`: the loop stops and saves."""
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
    torch.manual_seed(args.seed)  # torch draws every random number of training: actions, minibatches, masks, samples
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.reuse_host_memory and hasattr(libc := ctypes.CDLL(None), "mallopt"):  # glibc: else each minibatch page-faults
        libc.mallopt(-1, 2**30), libc.mallopt(-3, 2**25)  # trim threshold 1 GiB, mmap threshold 32 MiB
    torch.backends.cudnn.deterministic = args.torch_deterministic
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
    stop_signal: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))
    # Steps, SPS, ETA, recent return: live on a terminal, a plain line every 30 s in a log file.
    live = sys.stdout.isatty()
    log_lines = SimpleNamespace(write=lambda text: text.strip() and print(text.strip(), flush=True), flush=lambda: None)
    progress = tqdm(total=args.total_timesteps, initial=checkpoint["global_step"] if checkpoint else 0, unit="step",
                    unit_scale=True, file=sys.stdout if live else log_lines, mininterval=0.5 if live else 30)  # fmt: skip
    return run_dir, writer, progress, stop_signal


def save_checkpoint(run_dir: str, args: Args, iteration: int, global_step: int, embeddings: list, **state) -> None:
    """checkpoint.pt (state dicts, other state as it is, counters, RNG states: tensors and plain data for weights_only)
    and the new embeddings, each written to a temporary file and renamed: a crash never leaves half a file."""
    if state:
        # The training device's generator only: the run may resume on a machine with fewer GPUs.
        rng = {"torch": torch.get_rng_state(), "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else []}
        saved = {name: value.state_dict() if hasattr(value, "state_dict") else value for name, value in state.items()}
        path = os.path.join(run_dir, "checkpoint.pt")
        torch.save(
            saved | {"args": asdict(args), "rng": rng, "iteration": iteration, "global_step": global_step}, f"{path}.tmp"
        )
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


def finish_run(run_dir, writer, progress, args, global_step, embeddings, stop_signal, **state) -> None:
    """Interrupted: save a checkpoint and exit 128 + signal. Finished: the last checkpoint (with --checkpoint-interval),
    embeddings, model and video, then done.json (the completion marker that sweeps/launch.sh looks for)."""
    progress.close()
    iteration = global_step // args.batch_size  # iterations completed: an interrupted rollout is not counted
    interrupted = bool(stop_signal) and iteration < args.num_iterations
    checkpointed = state if interrupted or args.checkpoint_interval else {}  # else only the embeddings
    save_checkpoint(run_dir, args, iteration, global_step, embeddings, **checkpointed)
    writer.close()
    if interrupted:
        path = os.path.join(run_dir, "checkpoint.pt")
        print(f"stopped by signal {stop_signal[0]} at iteration {iteration}; continue with --resume {path}")
        sys.exit(128 + stop_signal[0])
    if args.save_model:
        path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        torch.save(state["model"].state_dict(), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    if args.capture_video:
        record_video(state["model"], args, run_dir)
    with open(os.path.join(run_dir, "done.json"), "w") as f:
        json.dump({"global_step": global_step, "iterations": iteration}, f)


@torch.no_grad()
def record_video(agent: Agent, args: Args, run_dir: str) -> None:
    """One game of the final policy in EnvPool's Atari (the training preprocessing), rendered to MP4."""
    from moviepy import ImageSequenceClip  # noqa: PLC0415 - only needed here

    env = envpool.make(args.env_id, env_type="gymnasium", num_envs=1, seed=args.seed, max_episode_steps=args.max_episode_steps,
                       episodic_life=True, reward_clip=True, repeat_action_probability=args.repeat_action_probability,
                       render_mode="rgb_array")  # fmt: skip
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
