"""PQN on Atari (EnvPool, gymnasium API) with the metrics of Mayor et al. (ICML 2025).

    python pqn_atari.py --env-id Breakout-v5 --num-envs 8 --num-steps 128

PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning"): a Q-network with LayerNorm
after every hidden layer, trained on-policy from parallel rollouts with Q(lambda) targets, epsilon-greedy
exploration, no replay buffer and no target network. The paper's Sec. 6.1 uses CleanRL's PQN; the
defaults are its Table 1. As in `ppo_atari_envpool.py`: EnvPool's reset step is masked out of the
targets, the loss and the metrics (time-limit truncations bootstrap from max_a Q of the last
observation); the metrics of `metrics.py` (plus `metrics/q_mean`) every `--metrics-interval`
iterations; `--minibatch-size` and `--lr-scaling` for the study's sweeps; checkpoints and `--resume`.
"""

from __future__ import annotations

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
import tyro
from torch import nn
from torch.nn import functional as F
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
    adam_eps: float = 1e-8
    """Adam epsilon"""
    gamma: float = 0.99
    """discount factor"""
    q_lambda: float = 0.65
    """lambda of the Q(lambda) targets"""
    update_epochs: int = 4
    """epochs over each rollout"""
    num_minibatches: int = 4
    """minibatches per epoch (ignored when --minibatch-size is given)"""
    minibatch_size: int | None = None
    """fix the minibatch size instead; the number of minibatches is derived (Beukman et al. 2026)"""
    max_grad_norm: float = 10.0
    """global gradient norm clipping"""
    # Exploration
    start_e: float = 1.0
    """epsilon of the epsilon-greedy policy at the start"""
    end_e: float = 0.01
    """epsilon after the decay (kept to the end; also used for the --capture-video game)"""
    exploration_fraction: float = 0.10
    """fraction of --total-timesteps over which epsilon decays linearly from --start-e to --end-e"""
    # Metrics
    metrics_interval: int = 10
    """compute the metrics/ tags every this many iterations and on the last (0: never)"""
    metrics_batch: int = 2048
    """at most this many states of the rollout are used for the metrics"""
    dormant_tau: float = 0.025
    """dormant-neuron threshold tau (Sokar et al. 2023)"""
    save_embeddings: bool = False
    """on metrics iterations save penultimate features and max_a Q to runs/.../embeddings.npz"""
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


class LayerNormCHW(nn.LayerNorm):
    """LayerNorm over a sample's (C, H, W) that reads an NHWC activation as it lies, as (H, W, C) with the weights
    permuted to match, instead of copying it to NCHW: the statistics are over the same entries in another order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
            return super().forward(x)
        hwc = (x.shape[2], x.shape[3], x.shape[1])
        return F.layer_norm(
            x.permute(0, 2, 3, 1), hwc, self.weight.permute(1, 2, 0), self.bias.permute(1, 2, 0), self.eps
        ).permute(0, 3, 1, 2)


def nature_cnn_layernorm() -> nn.Sequential:
    """Mnih et al. 2015 encoder with LayerNorm before every ReLU (Gallici et al. 2024). Each LayerNorm normalises
    the whole output of its layer per sample (channels x height x width for a convolution), as CleanRL's PQN does."""
    return nn.Sequential(
        layer_init(nn.Conv2d(4, 32, 8, stride=4)), LayerNormCHW([32, 20, 20]), nn.ReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)), LayerNormCHW([64, 9, 9]), nn.ReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)), LayerNormCHW([64, 7, 7]), nn.ReLU(),
        nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.LayerNorm(512), nn.ReLU(),
    )  # fmt: skip


class QNetwork(nn.Module):
    def __init__(self, num_actions: int, channels_last: bool = True):
        super().__init__()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.encoder = nature_cnn_layernorm()
        self.head = layer_init(nn.Linear(512, num_actions), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Penultimate features; uint8 pixels (B, 4, 84, 84) are scaled here (in place), after the (4x smaller)
        layout change."""
        return self.encoder(obs.contiguous(memory_format=self.memory_format).float().div_(255.0))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(s, .) for every action: (B, num_actions)."""
        return self.head(self.features(obs))


@torch.no_grad()
def measure_q_network(q_network: QNetwork, obs: torch.Tensor, dormant_tau: float) -> dict[str, float]:
    """The metrics/ tags that need a forward pass, after the update, on the metrics batch."""
    with metrics.hidden_activations(q_network) as activations:  # every hidden post-ReLU output, for the dormant neurons
        features = q_network.features(obs)
    return {
        "feature_rank": metrics.feature_rank(features),
        "dormant_pct": metrics.dormant_percentage(activations, dormant_tau),
        "weight_norm": metrics.weight_norm(q_network.parameters()),
        "q_mean": q_network.head(features).max(dim=-1).values.mean().item(),
    }


@torch.no_grad()
def embed(q_network: QNetwork, obs: torch.Tensor, iteration: int, global_step: int) -> dict[str, np.ndarray]:
    """Penultimate features and max_a Q of a few states, for the coverage plots (paper Fig. 2)."""
    features = q_network.features(obs)
    values = q_network.head(features).max(dim=-1).values
    return {"features": features.cpu().numpy().astype(np.float16), "values": values.cpu().numpy(),
            "iteration": np.full(len(obs), iteration), "global_step": np.full(len(obs), global_step)}  # fmt: skip


# ---- The maths of one iteration: small functions that a test can call on hand-made tensors ----
def reset_step_mask(previous_done: torch.Tensor) -> torch.Tensor:
    """1.0 for real transitions, 0.0 for EnvPool's reset steps: after an episode ends, EnvPool's next step
    ignores the action and returns the next episode's first observation with reward 0 (cleanrl issue 475)."""
    return 1.0 - previous_done


def epsilon_schedule(step: int, start_e: float, end_e: float, exploration_steps: float) -> float:
    """Linear decay from start_e at step 0 to end_e at `exploration_steps`, then constant."""
    return end_e if step >= exploration_steps else start_e + (end_e - start_e) * step / exploration_steps


def epsilon_greedy(q_values: torch.Tensor, epsilon: float) -> torch.Tensor:
    """One action per row of (B, A) Q-values: uniform with probability epsilon, else greedy."""
    batch, num_actions = q_values.shape
    uniform = torch.randint(num_actions, (batch,), device=q_values.device)
    explore = torch.rand(batch, device=q_values.device) < epsilon
    return torch.where(explore, uniform, q_values.argmax(dim=-1))


def compute_q_lambda_targets(rewards, next_max_q, terminations, truncations, valid, gamma: float, q_lambda: float):
    """Q(lambda) targets over a (T, N) rollout with reset steps masked.

    Row t holds r_t, whether s_{t+1} ended the episode, and next_max_q[t] = max_a Q(s_{t+1}, a)
    (for the last row: of the observation after the rollout). Then
        G_t = r_t + gamma * [(1 - lambda) * next_max_q[t] + lambda * G_{t+1}],
    cut at episode ends: a termination does not bootstrap (G_t = r_t); a truncation
    bootstraps fully from next_max_q[t] (s_{t+1} is the real last observation: EnvPool
    returns it and resets one step later), without the lambda continuation; after the last
    row G_t = r_t + gamma * next_max_q[t]. Reset steps (valid = 0) get target 0.
    """
    targets = torch.zeros_like(rewards)
    following_return = next_max_q[-1]  # G_T := max_a Q(s_T): the last row bootstraps fully
    for t in reversed(range(rewards.shape[0])):
        episode_ends = torch.maximum(terminations[t], truncations[t])
        # (1 - lambda) * maxQ + lambda * G_{t+1}, or maxQ alone where the episode ended
        continuation = next_max_q[t] + q_lambda * (1.0 - episode_ends) * (following_return - next_max_q[t])
        following_return = (rewards[t] + gamma * (1.0 - terminations[t]) * continuation) * valid[t]
        targets[t] = following_return
    return targets


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def td_loss(q_taken: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 * mean (Q(s, a) - G)^2 over one minibatch; entries with mask 0 do not count."""
    loss = 0.5 * masked_mean((q_taken - targets).square(), mask)
    return loss, {"td_loss": loss.detach(), "q_values": masked_mean(q_taken.detach(), mask)}


def minibatch_backward(q_network: QNetwork, minibatch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Forward pass, TD loss and backward pass of one minibatch (one compiled graph with --compile); the loss statistics."""
    q_taken = q_network(minibatch["obs"]).gather(1, minibatch["actions"][:, None]).squeeze(1)
    loss, stats = td_loss(q_taken, minibatch["targets"], minibatch["valid"])
    loss.backward()
    return stats


def phase_at(args: Args, step: int) -> tuple[int, int, int]:
    """N_envs, N_RO and the minibatch size of the phase that `step` falls in: a fixed --minibatch-size stays, else the
    number of minibatches does."""
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
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")

    q_network = QNetwork(envpool.make_spec(args.env_id).action_space.n, args.channels_last).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=args.fused_adam)
    # Only the forward pass: epsilon_greedy stays eager, as compiled code draws other random numbers than eager torch.
    act, backward = q_network, minibatch_backward
    if args.compile:  # the same functions as compiled graphs; with --cudagraphs, replayed as CUDA graphs
        act, backward = (torch.compile(f, mode="reduce-overhead" if args.cudagraphs else None) for f in (act, backward))
    state = {"model": q_network, "optimizer": optimizer}  # what a checkpoint holds
    global_step = restore_checkpoint(checkpoint, **state) if checkpoint else 0
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1

    # Full-game statistics: EnvPool's episodic_life ends an "episode" per life, but the score
    # that matters is the whole game (info["terminated"] marks the real game over).
    recent_returns: deque[float] = deque(maxlen=20)
    embeddings: list[dict[str, np.ndarray]] = []
    start_time, start_step, phase, iteration = time.time(), global_step, None, start_iteration - 1
    exploration_steps = args.exploration_fraction * args.total_timesteps

    for iteration in range(start_iteration, args.num_iterations + 1):
        if phase_at(args, global_step) != phase:  # EnvPool cannot resize a pool: a new phase plays new games in a new pool
            phase = phase_at(args, global_step)
            (num_envs, num_steps, minibatch_size), batch_size = phase, phase[0] * phase[1]
            # A resumed run or a new phase starts new games from another env seed: EnvPool's state cannot be saved.
            envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=num_envs, seed=args.seed + iteration - 1,
                                max_episode_steps=args.max_episode_steps, episodic_life=True, reward_clip=True)  # fmt: skip
            # Rollout storage on the training device (a variant adds a field in one line); pixels stay uint8 until the network.
            size = (num_steps, num_envs)
            # Frames laid out as the network reads them (NHWC with --channels-last): the flattened batch is a view, not a copy.
            frames = torch.empty((size[0] * size[1], *envs.observation_space.shape), dtype=torch.uint8, device=device,
                                 memory_format=q_network.memory_format)  # fmt: skip
            rollout = {
                "obs": frames.zero_().unflatten(0, size),
                "actions": torch.zeros(size, dtype=torch.long, device=device),
                "max_q": torch.zeros(size, device=device),  # max_a Q(s_t, a) when acting
            }
            # What EnvPool returns stays on the host until the rollout ends: one copy to the device per rollout, not per step.
            host = {name: np.zeros(size, dtype=np.float32) for name in ("rewards", "terminations", "truncations", "valid")}
            next_obs = torch.tensor(envs.reset()[0], device=device)
            # EnvPool's frames pass through page-locked memory on CUDA, from where the copy to the GPU runs asynchronously.
            host_obs = torch.empty_like(next_obs, device="cpu").pin_memory() if device.type == "cuda" else next_obs
            next_done, game_return = np.zeros(num_envs, dtype=np.float32), np.zeros(num_envs)
        optimizer.param_groups[0]["lr"] = learning_rate(args, num_envs, global_step)

        rollout_start_step = global_step
        for step in range(num_steps):
            epsilon = epsilon_schedule(global_step, args.start_e, args.end_e, exploration_steps)
            global_step += num_envs
            rollout["obs"][step] = next_obs
            host["valid"][step] = reset_step_mask(next_done)
            with torch.inference_mode():
                q_values = act(next_obs)
                action = epsilon_greedy(q_values, epsilon)
            rollout["actions"][step], rollout["max_q"][step] = action, q_values.max(dim=-1).values

            next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())  # the step's one sync
            host_obs.copy_(torch.from_numpy(next_obs_np))  # free again: the last sync waited for the forward pass that read it
            next_obs.copy_(host_obs, non_blocking=True)  # a no-op on the CPU, where host_obs is next_obs
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

        # Targets once per iteration, from the network that collected the rollout.
        with torch.no_grad():
            next_max_q = torch.cat([rollout["max_q"][1:], q_network(next_obs).max(dim=-1).values[None]])
        rollout["targets"] = compute_q_lambda_targets(
            rollout["rewards"], next_max_q, rollout["terminations"], rollout["truncations"], rollout["valid"],
            args.gamma, args.q_lambda)  # fmt: skip
        batch = {name: values.flatten(0, 1) for name, values in rollout.items()}

        measure = args.metrics_interval > 0 and (iteration % args.metrics_interval == 0 or iteration == args.num_iterations)
        grad_norms, minibatch_stats, gradient_kurtosis = [], [], None
        for _epoch in range(args.update_epochs):
            permutation = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                minibatch = {name: values[permutation[start : start + minibatch_size]] for name, values in batch.items()}
                optimizer.zero_grad()
                # .clone(): a CUDA graph overwrites its outputs at its next replay
                stats = {name: value.clone() for name, value in backward(q_network, minibatch).items()}
                if measure and gradient_kurtosis is None:
                    gradient_kurtosis = metrics.gradient_kurtosis(p.grad for p in q_network.parameters() if p.grad is not None)
                grad_norms.append(nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm))
                optimizer.step()
                minibatch_stats.append(stats)

        charts = {"learning_rate": optimizer.param_groups[0]["lr"], "epsilon": epsilon,  # of the rollout's last step
                  "num_envs": num_envs, "num_steps": num_steps, "batch_size": batch_size}  # fmt: skip
        losses = {name: torch.stack([s[name] for s in minibatch_stats]).mean() for name in minibatch_stats[0]}
        measured = {}
        if measure:
            valid_index = torch.nonzero(batch["valid"].bool()).squeeze(1)
            sample = valid_index[torch.randperm(valid_index.numel(), device=device)[: args.metrics_batch]]
            measured = measure_q_network(q_network, batch["obs"][sample], args.dormant_tau)
            measured |= {"grad_kurtosis": gradient_kurtosis, "grad_norm": torch.stack(grad_norms).mean().item()}
            if args.save_embeddings:
                embedded = sample[: args.embeddings_per_iteration]
                embeddings.append(embed(q_network, batch["obs"][embedded], iteration, global_step))
        charts["SPS"] = int((global_step - start_step) / (time.time() - start_time))  # after the metrics: their cost counts
        for group, scalars in {"charts": charts, "losses": losses, "metrics": measured}.items():
            for name, value in scalars.items():
                writer.add_scalar(f"{group}/{name}", value, global_step)
        progress.set_postfix(episodic_return=np.mean(recent_returns) if recent_returns else float("nan"), refresh=False)
        progress.update(global_step - progress.n)
        if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
            save_checkpoint(run_dir, args, iteration, global_step, embeddings, **state)

    finish_run(run_dir, writer, progress, args, iteration, global_step, embeddings, stop_signal, **state)


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
    # --minibatch-size and --torch-threads may also be None (not given)
    positive = ("total_timesteps", "max_episode_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                "lr_reference_envs", "metrics_batch", "embeddings_per_iteration", "learning_rate", "adam_eps",
                "max_grad_norm", "minibatch_size", "torch_threads")  # fmt: skip
    non_negative = ("checkpoint_interval", "metrics_interval", "dormant_tau")
    unit_interval = ("gamma", "q_lambda", "start_e", "end_e", "exploration_fraction")
    ranges = ((positive, lambda v: v is None or v > 0, "> 0"), (non_negative, lambda v: v >= 0, ">= 0"),
              (unit_interval, lambda v: 0 <= v <= 1, "in [0, 1]"))  # fmt: skip
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # set by torchrun: each process would train the same run on its own
        fail(
            f"pqn_atari.py runs as one process: start it with python, not torchrun (which would run "
            f"{os.environ['WORLD_SIZE']} identical copies); the PPO scripts split one run over torchrun's processes"
        )
    checks = [(ok(getattr(args, name)), f"{flag(name)} must be {bound}, got {getattr(args, name)}")
              for names, ok, bound in ranges for name in names]  # fmt: skip
    phases = parse_schedule(args.schedule) if args.schedule else [(0.0, args.num_envs, args.num_steps)]
    split = f"--minibatch-size {args.minibatch_size}" if args.minibatch_size else f"--num-minibatches {args.num_minibatches}"
    for _, num_envs, num_steps in phases:
        batch_size = num_envs * num_steps
        minibatch_size = args.minibatch_size or batch_size // max(args.num_minibatches, 1)
        checks.append((minibatch_size > 0 and batch_size % minibatch_size == 0,
                       f"{split} does not divide the batch (num_envs * num_steps = {batch_size}) "
                       "into equal minibatches"))  # fmt: skip
    checks += [
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
    torch.manual_seed(args.seed)  # torch draws every random number of training: exploration, minibatches, samples
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


def save_checkpoint(run_dir: str, args: Args, iteration: int, global_step: int, embeddings: list, **modules) -> None:
    """checkpoint.pt (state dicts, counters, RNG states: tensors and plain data for weights_only) and the
    new embeddings, each written to a temporary file and renamed: a crash never leaves half a file."""
    if modules:
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


def finish_run(run_dir, writer, progress, args, iteration, global_step, embeddings, stop_signal, **modules) -> None:
    """Interrupted: save a checkpoint and exit 128 + signal. Finished: the last checkpoint (with --checkpoint-interval),
    embeddings, model and video, then done.json (the completion marker that sweeps/launch.sh looks for)."""
    progress.close()
    interrupted = bool(stop_signal) and global_step < args.planned_steps
    iteration -= interrupted  # the interrupted rollout is not counted
    checkpointed = modules if interrupted or args.checkpoint_interval else {}  # else only the embeddings
    save_checkpoint(run_dir, args, iteration, global_step, embeddings, **checkpointed)
    writer.close()
    if interrupted:
        path = os.path.join(run_dir, "checkpoint.pt")
        print(f"stopped by signal {stop_signal[0]} at iteration {iteration}; continue with --resume {path}")
        sys.exit(128 + stop_signal[0])
    if args.save_model:
        path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        torch.save(modules["model"].state_dict(), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    if args.capture_video:
        record_video(modules["model"], args, run_dir)
    with open(os.path.join(run_dir, "done.json"), "w") as f:
        json.dump({"global_step": global_step, "iterations": iteration}, f)


@torch.no_grad()
def record_video(q_network: QNetwork, args: Args, run_dir: str) -> None:
    """One game of the final epsilon-greedy policy (epsilon = --end-e) in EnvPool's Atari (the training
    preprocessing), rendered to MP4."""
    from moviepy import ImageSequenceClip  # noqa: PLC0415 - only needed here

    env = envpool.make(args.env_id, env_type="gymnasium", num_envs=1, seed=args.seed, max_episode_steps=args.max_episode_steps,
                       episodic_life=True, reward_clip=True, render_mode="rgb_array")  # fmt: skip
    obs, frames, game_return, game_over = env.reset()[0], [], 0.0, False
    q_network.cpu()  # training is over
    while not game_over:
        frames.append(env.render()[0])
        obs, _, _, truncated, info = env.step(epsilon_greedy(q_network(torch.as_tensor(obs)), args.end_e).numpy())
        game_return += info["reward"][0]
        game_over = info["terminated"][0] or truncated[0]
    path = os.path.join(run_dir, "videos", "eval.mp4")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ImageSequenceClip(frames, fps=15).write_videofile(path, logger=None)  # 15 agent steps = 60 frames = 1 s
    print(f"video of one evaluation game (return {game_return:g}): {path}")


if __name__ == "__main__":
    main()
