"""The update alone in float32 and under bfloat16 autocast, side by side in one process, for each script's network.

    python benchmarks/bf16_update.py                 # CPU, torch's default threads
    python benchmarks/bf16_update.py --threads 1     # one thread
    python benchmarks/bf16_update.py --cuda          # on the GPU (TF32 on for float32, as the scripts' default)

One timed step is what the scripts do per minibatch: forward pass, a squared-error loss on the heads' float32 outputs,
backward pass and an Adam step, on a minibatch of the script's default size (Atari 8 x 128 / 4 = 256 frames, Procgen
64 x 256 / 8 = 2048, ppo_isaacgym.py 4096 x 16 / 2 = 32768 observations of Ant's 27 numbers). The body runs under
autocast exactly as `--bf16` runs it (each network's own flag): convolutions and hidden dense layers in bfloat16. The
two precisions alternate for --rounds rounds of --steps steps; the table gives the median seconds per step and the
ratio. The Isaac Gym MLP has no `--bf16` flag: this is the measurement that decided it (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_atari_envpool  # noqa: E402
import ppo_isaacgym  # noqa: E402
import ppo_procgen  # noqa: E402
import pqn_atari  # noqa: E402


@dataclass
class Args:
    rounds: int = 4
    """rounds, each timing both precisions (the first round warms up and is dropped)"""
    steps: int = 2
    """minibatch updates per precision and round"""
    threads: int | None = None
    """torch's CPU threads (default: torch's own)"""
    cuda: bool = False
    """run on the GPU"""
    scale: float = 1.0
    """fraction of each default minibatch size to time (the tests run a tiny one)"""


def networks(bf16: bool, device: torch.device, scale: float):
    """(name, network, its minibatch, a function from network and minibatch to the heads' float32 outputs)."""
    size = lambda default: max(1, round(default * scale))  # noqa: E731
    atari = torch.randint(0, 256, (size(256), 4, 84, 84), dtype=torch.uint8, device=device)
    procgen = torch.randint(0, 256, (size(2048), 3, 64, 64), dtype=torch.uint8, device=device)
    ant = torch.randn(size(32768), 27, device=device)
    ppo_outputs = lambda agent, obs: agent.get_action_and_value(obs)[1:4]  # noqa: E731 - log-prob, entropy, value
    return [
        ("ppo_atari_envpool.Agent (Nature CNN)", ppo_atari_envpool.Agent(4, False, bf16=bf16), atari, ppo_outputs),
        ("pqn_atari.QNetwork (Nature CNN + LayerNorm)", pqn_atari.QNetwork(4, bf16=bf16), atari, lambda q, obs: [q(obs)]),
        ("ppo_procgen.Agent (IMPALA CNN)", ppo_procgen.Agent(15, False, bf16=bf16), procgen, ppo_outputs),
        ("ppo_isaacgym.Agent (MLP 2 x 256)", ppo_isaacgym.Agent(27, 8, False, bf16=bf16), ant, ppo_outputs),
    ]


def seconds_per_update(network, obs, outputs, steps: int, synchronize) -> float:
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-4, fused=True)
    synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        sum(output.float().square().mean() for output in outputs(network, obs)).backward()
        optimizer.step()
    synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
    # rounds >= 2: the first is dropped; threads <= 1024: torch takes a C int (0 meant torch's default, 1e20 a traceback)
    threads = 1 if args.threads is None else args.threads
    bounds = {"rounds": (args.rounds, 2, None), "steps": (args.steps, 1, None), "threads": (threads, 1, 1024)}
    for flag, (value, low, high) in bounds.items():
        if not low <= value <= (high or value):
            print(f"error: --{flag} {value}: must be at least {low}" + (f", at most {high}" if high else ""), file=sys.stderr)
            sys.exit(2)
    if not 0 < args.scale <= 1:  # nan ended in a traceback; 0 timed minibatches of 1
        print(f"error: --scale {args.scale}: must be > 0 and at most 1 (a fraction of the default minibatch)", file=sys.stderr)
        sys.exit(2)
    if args.cuda and not torch.cuda.is_available():
        sys.exit("error: --cuda: no CUDA device is visible")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # the scripts' default (--tf32)
    synchronize = torch.cuda.synchronize if args.cuda else lambda: None
    torch.manual_seed(0)
    candidates = {precision: networks(precision == "bf16", device, args.scale) for precision in ("fp32", "bf16")}
    name = torch.cuda.get_device_name() if args.cuda else f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"device: {name}; torch {torch.__version__}; median of {args.rounds - 1} rounds x {args.steps} updates")
    print(f"{'network':<46}{'minibatch':>10}{'fp32 s':>10}{'bf16 s':>10}{'fp32 / bf16':>13}")
    for index in range(len(candidates["fp32"])):
        timings = {"fp32": [], "bf16": []}
        for _ in range(args.rounds):
            for precision, rows in candidates.items():
                _, network, obs, outputs = rows[index]
                timings[precision].append(seconds_per_update(network.to(device), obs, outputs, args.steps, synchronize))
        fp32, bf16 = (statistics.median(values[1:]) for values in timings.values())
        label, _, obs, _ = candidates["fp32"][index]
        print(f"{label:<46}{len(obs):>10}{fp32:>10.4f}{bf16:>10.4f}{fp32 / bf16:>13.2f}")


if __name__ == "__main__":
    main()
