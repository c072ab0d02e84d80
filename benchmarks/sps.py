"""Throughput of the training scripts next to EnvPool's raw stepping rate, in one run.

    python benchmarks/sps.py                      # all six scripts, 8 envs x 128 steps, 50 iterations; --bf16 too
    python benchmarks/sps.py --candidates compile "compile cudagraphs" --cuda   # also --compile, --compile --cudagraphs
    python benchmarks/sps.py --scripts ppo_atari_envpool.py --num-envs 128 --total-timesteps 327680 --cuda --steady
    python benchmarks/sps.py --nproc 2            # also: one run as 2 torchrun processes against 1
    python benchmarks/sps.py --jobs 2             # also: 2 concurrent runs with and without the thread split
    python benchmarks/sps.py --cuda --candidates no-torch-deterministic   # the cost of cuDNN's deterministic kernels
    python benchmarks/sps.py --scripts --mjwarp --num-envs 4096 --num-steps 16 --cuda   # only Ant: Warp vs EnvPool
    python benchmarks/sps.py --scripts --kinetix --kinetix-envs 256 2048 --steady   # only Kinetix: alone vs PPO

The Atari scripts run Breakout-v5, ppo_procgen.py BigfishEasy-v0 and ppo_isaacgym.py
EnvPool's Ant-v5 (`--env-id`, `--procgen-env-id`, `--mujoco-env-id`).
Prints, measured on this machine in this one invocation:
  1. EnvPool's raw rate of each task for the same num_envs with random actions (no learning);
  2. for each script, the training SPS of the eager path as CleanRL runs it (`--no-compile
     --no-channels-last --no-fused-adam --no-reuse-host-memory`: NCHW pixels, per-tensor-list Adam,
     glibc's default malloc, nothing compiled;
     ppo_isaacgym.py has no pixels), of the script's defaults, and of each
     `--candidates` flag set (default: --bf16), all with metrics at the default interval, and of the defaults with
     metrics off (--metrics-interval 0); the settings alternate `--repeats` times (median of each);
  3. the ratios: defaults / eager path and each candidate / eager path (compile time counted: it happens inside
     the training loop), defaults / raw, and the throughput cost of the metrics (target < 5 %), twice: end to
     end (SPS on / off, which run-to-run noise of a few percent blurs on a busy CPU) and by
     direct timing (the seconds one metrics computation takes on the metrics batch, measured in
     this process on real frames on the training device, divided by the seconds of
     `metrics-interval` training iterations at the metrics-off SPS); and the cost of the per-iteration NaN/inf
     check (`stop_if_not_finite`) by the same direct timing, against one iteration.
With --nproc K, a second table: for each script that runs under torchrun, the SPS of one
process stepping all N envs against K processes of one run stepping N / K each (on the CPU with
cores / K torch threads each, so that they do not fight over the cores; with --cuda each on its own GPU), alternated.
With --mjwarp, a table for Ant at --num-envs: EnvPool's Ant-v5 on the CPU and Gymnasium's Ant-v5 on
MuJoCo Warp (mujoco_warp_tasks.py, on the training device), each simulator alone with random
actions and PPO end to end (ppo_isaacgym.py --backend envpool / mjwarp).
With --kinetix, a table for Kinetix's hand-designed levels of --kinetix-env-size at each of --kinetix-envs, on the
training device (named with the table): the env steps per second of Kinetix alone (ppo_kinetix.py's KinetixTasks,
stepped --kinetix-steps times with uniformly random MultiDiscrete actions after a step that compiles), of PPO end to
end (ppo_kinetix.py for --kinetix-iterations iterations; its charts/SPS at the last iteration but one, as the last
evaluates the solve rate) and their ratio, and on a GPU the most memory the PPO run used (the whole device's, polled);
the two measurements of a size run one after the other.
With --jobs J, a third table: J runs of each script at the same time, first each with
torch's default threads (every core), then with cores / J threads each (OMP_NUM_THREADS, as
sweeps/launch.sh sets for JOBS=J), and the per-run SPS of both; on the CPU only (on a GPU the scripts take 1 thread).
Every script runs the same batch shape (ppo_rnd_atari.py with a one-iteration
observation-normalisation warm-up, which is not timed).
Training SPS is the script's own charts/SPS at the end of the run (env steps per second
of the training loop, imports and env creation excluded); with --steady, the rate after the first iteration (on a GPU
the first carries CUDA's start, cuDNN's autotuning and most of the compiling).
A run that fails is reported on stderr and its cells read `failed` (the medians are over the runs
that succeeded); the other measurements still print, and the exit status is then 1.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


# Flags a script needs beyond the shared ones for a short benchmark run.
EXTRA_FLAGS = {"ppo_rnd_atari.py": ["--num-iterations-obs-norm-init", "1"], "ppo_isaacgym.py": ["--backend", "envpool"]}
# The eager path as CleanRL runs it (the MLP of ppo_isaacgym.py has no pixels to lay out).
EAGER_FLAGS = {"ppo_isaacgym.py": ["--no-compile", "--no-fused-adam", "--no-reuse-host-memory"]}
CLEANRL_EAGER = ["--no-compile", "--no-channels-last", "--no-fused-adam", "--no-reuse-host-memory"]
TORCHRUN_SCRIPTS = ("ppo_atari_envpool.py", "ppo_ewma_atari.py", "ppo_procgen.py", "ppo_isaacgym.py")
ALL_SCRIPTS = (
    "ppo_atari_envpool.py",
    "ppo_ewma_atari.py",
    "pqn_atari.py",
    "ppo_rnd_atari.py",
    "ppo_procgen.py",
    "ppo_isaacgym.py",
)
KINETIX = "ppo_kinetix.py"
KINETIX_MINIBATCHES = 32  # passed to ppo_kinetix.py (its default, Beukman's Table 2): a batch must split into them
FAILED_RUNS = []  # training runs that exited non-zero, for main's exit status (the --jobs threads append too)


@dataclass
class Args:
    scripts: tuple[str, ...] = ALL_SCRIPTS
    """training scripts to measure"""
    env_id: str = "Breakout-v5"
    """EnvPool Atari task of the Atari scripts"""
    procgen_env_id: str = "BigfishEasy-v0"
    """EnvPool Procgen task of ppo_procgen.py"""
    mujoco_env_id: str = "Ant-v5"
    """EnvPool MuJoCo task of ppo_isaacgym.py"""
    num_envs: int = 8
    """parallel environments (as --num-envs)"""
    num_steps: int = 128
    """rollout length (as --num-steps)"""
    total_timesteps: int = 50 * 1024
    """steps per training run (50 iterations of 8 x 128: long enough to count compile time fairly)"""
    metrics_interval: int = 10
    """the interval measured against metrics off (the script's default is 10)"""
    metrics_batch: int = 2048
    """states in the metrics batch, passed to every run (the scripts' --metrics-batch default)"""
    repeats: int = 1
    """training runs per setting, the settings alternated; the median is reported"""
    candidates: tuple[str, ...] = ("bf16",)
    """further flag sets to time next to the defaults, each one string of flags without their dashes, a value joined by
    `=` (compile "compile cudagraphs" torch-threads=16: --compile, then --compile --cudagraphs, then --torch-threads=16);
    each also gets its ratio to the eager path"""
    raw_steps: int = 2000
    """batched env.step calls for the raw EnvPool rate"""
    cuda: bool = False
    """train on the GPU (pass --cuda on a GPU machine)"""
    nproc: int = 1
    """above 1: also compare one process with this many torchrun processes of one run"""
    jobs: int = 1
    """above 1: also run this many training runs at once, without and with the thread split"""
    steady: bool = False
    """training SPS after the first iteration (the rate between the first and last iterations' charts/SPS points):
    start-up, cuDNN's autotuning and the first iteration's compiling left out; needs 2 iterations a run"""
    mjwarp: bool = False
    """also: Ant on MuJoCo Warp against EnvPool's Ant-v5, the simulators alone and PPO end to end (--num-envs each)"""
    warp_steps: int = 20
    """batched steps for MuJoCo Warp's rate (slow on a CPU: about 25 a second at 64 worlds)"""
    kinetix: bool = False
    """also: Kinetix alone (random actions) against PPO end to end (ppo_kinetix.py), at each of --kinetix-envs"""
    kinetix_envs: tuple[int, ...] = ()
    """the numbers of environments of the Kinetix table, one row each (256 2048); none given: --num-envs"""
    kinetix_env_size: Literal["s", "m", "l"] = "s"
    """Kinetix's size class; its hand-designed levels (ppo_kinetix.py --task-set handmade)"""
    kinetix_steps: int = 100
    """batched steps for the rate of Kinetix alone"""
    kinetix_iterations: int = 4
    """iterations of each ppo_kinetix.py run (of --num-steps); the last, which evaluates the solve rate, is not timed"""


def task_of(args: Args, script: str) -> str:
    return {"ppo_procgen.py": args.procgen_env_id, "ppo_isaacgym.py": args.mujoco_env_id}.get(script, args.env_id)


def task_flags(args: Args, script: str) -> list[str]:
    """The flags that give a training run its task: EnvPool's --env-id, or for ppo_kinetix.py Kinetix's hand-designed
    levels of --kinetix-env-size, the solve rate evaluated only after the last iteration (which the rate leaves out)."""
    if script == KINETIX:
        size = ["--task-set", "handmade", "--env-size", args.kinetix_env_size]
        return [*size, "--num-minibatches", str(KINETIX_MINIBATCHES), "--eval-interval", "0", "--no-eval-handmade"]
    return ["--env-id", task_of(args, script)]


def make_envs(env_id: str, num_envs: int, seed: int):
    import envpool  # noqa: PLC0415

    is_atari = type(envpool.make_spec(env_id)).__name__ == "AtariEnvSpec"
    atari = {"episodic_life": True, "reward_clip": True} if is_atari else {}  # as the Atari scripts make them
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **atari)


def random_actions(envs, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    space = envs.action_space
    if hasattr(space, "n"):
        return rng.integers(0, space.n, size=shape)
    return rng.uniform(space.low, space.high, size=shape + space.shape)


def raw_envpool_sps(env_id: str, num_envs: int, steps: int) -> float:
    envs = make_envs(env_id, num_envs, seed=0)
    envs.reset()
    actions = random_actions(envs, np.random.default_rng(0), (steps, num_envs))
    start = time.perf_counter()
    for step in range(steps):
        envs.step(actions[step])
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * num_envs / elapsed


def real_observations(env_id: str, num_envs: int, count: int) -> tuple[np.ndarray, int]:
    """`count` observations from EnvPool with random actions (the metrics batch is real
    observations), and the number of actions (discrete) or action dimensions (continuous)."""
    envs = make_envs(env_id, num_envs, seed=1)
    rng = np.random.default_rng(1)
    observations = [envs.reset()[0]]
    while len(observations) * num_envs < count:
        observations.append(envs.step(random_actions(envs, rng, (num_envs,)))[0])
    envs.close()
    space = envs.action_space
    return np.concatenate(observations)[:count], space.n if hasattr(space, "n") else space.shape[0]


def metrics_seconds(script: str, frames: np.ndarray, num_actions: int, batch_size: int, device: str) -> float:
    """Median seconds of one metrics computation of `script` on `device`: its measure function
    on the metrics batch, plus the gradient kurtosis of one minibatch's gradients."""
    import torch  # noqa: PLC0415

    module = importlib.import_module(script.removesuffix(".py"))
    torch.manual_seed(0)
    obs = torch.as_tensor(frames, device=device)
    if script == "ppo_isaacgym.py":  # Gaussian policy on float observations; num_actions = action dimensions
        obs = obs.float()
        network = module.Agent(obs.shape[1], num_actions, True).to(device)
        shape = (obs.shape[0], num_actions)
        actions, means = torch.randn(shape, device=device), torch.randn(shape, device=device)
        stds = torch.ones(shape, device=device)
        measure = lambda: module.measure_agent(network, obs, actions, means, stds, batch_size, 0.025)  # noqa: E731
    elif script == "pqn_atari.py":
        network = module.QNetwork(num_actions).to(device)
        measure = lambda: module.measure_q_network(network, obs, 0.025)  # noqa: E731
    else:
        network = module.Agent(num_actions, False).to(device)
        actions = torch.randint(num_actions, (obs.shape[0],), device=device)
        logits = torch.randn(obs.shape[0], num_actions, device=device)
        proximal = (copy.deepcopy(network),) if script == "ppo_ewma_atari.py" else ()
        measure = lambda: module.measure_agent(network, obs, actions, logits, batch_size, 0.025, *proximal)  # noqa: E731
    for parameter in network.parameters():  # the kurtosis cost depends on the number of entries only
        parameter.grad = torch.randn_like(parameter)
    # CUDA kernels run asynchronously: wait for them so that the clock times the work, not its queueing
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    timings = []
    for _ in range(6):
        synchronize()
        start = time.perf_counter()
        measure()
        module.metrics.gradient_kurtosis(p.grad for p in network.parameters())
        synchronize()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings[1:])  # the first call warms up


def finite_check_seconds(script: str, frames: np.ndarray, batch_size: int, device: str) -> float:
    """Median seconds of the per-iteration NaN/inf check (`stop_if_not_finite`, one host-device sync) on what it reads
    at this batch: the rewards (and ppo_isaacgym.py's observations), an update's loss statistics and gradient norms."""
    import torch  # noqa: PLC0415

    module = importlib.import_module(script.removesuffix(".py"))
    values = {"rewards": torch.zeros(batch_size, device=device), "losses_or_gradients": torch.zeros(96, device=device)}
    if script == "ppo_isaacgym.py":
        values["observations"] = torch.zeros((batch_size, frames.shape[1]), device=device)
    timings = []
    for _ in range(21):
        start = time.perf_counter()
        module.stop_if_not_finite(1, 1, **values)
        timings.append(time.perf_counter() - start)
    return statistics.median(timings[1:])  # the first call warms up


def training_sps(args: Args, script: str, metrics_interval: int, nproc: int = 1, threads: int = 0, flags=()) -> float:
    """The SPS of one training run (logged_sps), NaN if it failed; `threads` > 0 sets OMP_NUM_THREADS (torchrun:
    cores / nproc)."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    threads = threads or (max(1, (os.cpu_count() or 1) // nproc) if nproc > 1 and not args.cuda else 0)
    environment = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    with tempfile.TemporaryDirectory() as runs_dir:
        command = [
            sys.executable,
            *torchrun,
            os.path.join(ROOT, script),
            *task_flags(args, script),
            *EXTRA_FLAGS.get(script, []),
            "--num-envs",
            str(args.num_envs),
            "--num-steps",
            str(args.num_steps),
            "--total-timesteps",
            str(args.total_timesteps),
            "--metrics-interval",
            str(metrics_interval),
            "--metrics-batch",  # the batch that the direct timing measures
            str(args.metrics_batch),
            "--runs-dir",
            runs_dir,
            "--cuda" if args.cuda else "--no-cuda",
            *flags,
        ]
        threads_env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
        result = subprocess.run(
            command,
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**environment, **threads_env},
        )
        if result.returncode:  # reported, not fatal: one crashing flag set must not lose the other measurements
            lines = [line.strip(" │╭╮╰╯─") for line in result.stderr.splitlines()]  # tyro's errors come in a box
            last_line = next((line for line in reversed(lines) if line), "")
            print(
                f"failed: {' '.join([script, *flags])} ({args.num_envs} envs, metrics interval {metrics_interval}, "
                f"{nproc} process(es)) exited with status {result.returncode}: {last_line}",
                file=sys.stderr,
            )
            FAILED_RUNS.append(command)
            return math.nan
        event_file = glob.glob(os.path.join(runs_dir, "*", "events.out.tfevents.*"))[0]
        return logged_sps(event_file, args.steady, untimed_last=int(script == KINETIX))  # its last evaluates


def logged_sps(event_file: str, steady: bool, untimed_last: int = 0) -> float:
    """The run's charts/SPS at its end (training since the loop began) or, `steady`, the steps per second between the
    first and last iterations' points (by the event file's times); `untimed_last` iterations at the end left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415

    accumulator = EventAccumulator(event_file)
    accumulator.Reload()
    points = accumulator.Scalars("charts/SPS")
    first, last = points[0], points[-1 - untimed_last]
    return (last.step - first.step) / (last.wall_time - first.wall_time) if steady else last.value


def main() -> None:
    args = tyro.cli(Args, description=__doc__)
    unknown = sorted(set(args.scripts) - set(ALL_SCRIPTS))
    if unknown:
        print(f"error: --scripts: unknown {', '.join(unknown)} (choose from {', '.join(ALL_SCRIPTS)})", file=sys.stderr)
        sys.exit(2)
    counts = {"num-envs": args.num_envs, "num-steps": args.num_steps, "metrics-interval": args.metrics_interval}
    counts |= {"metrics-batch": args.metrics_batch, "repeats": args.repeats, "raw-steps": args.raw_steps}
    counts |= {"warp-steps": args.warp_steps, "kinetix-steps": args.kinetix_steps}
    counts |= {"kinetix-iterations": args.kinetix_iterations, "total-timesteps": args.total_timesteps}
    for flag, value in [*counts.items(), *(("kinetix-envs", envs) for envs in args.kinetix_envs)]:
        if value < 1:
            print(f"error: --{flag} {value}: must be at least 1", file=sys.stderr)
            sys.exit(2)
    if args.steady and args.total_timesteps < 2 * args.num_envs * args.num_steps:
        print(f"error: --steady: --total-timesteps {args.total_timesteps} is under 2 iterations a run", file=sys.stderr)
        sys.exit(2)
    for candidate in args.candidates:  # a word not a flag name (say `torch-threads 16`) would reach the script as --16
        if not all(word[:1].isalpha() for word in candidate.split()):
            print(
                f"error: --candidates '{candidate}': give flags without dashes, a value joined by = (torch-threads=16)",
                file=sys.stderr,
            )
            sys.exit(2)
    if args.jobs < 1 or (args.jobs > 1 and args.cuda):
        print(f"error: --jobs {args.jobs}: >= 1, and 1 with --cuda (the thread split is the CPU's)", file=sys.stderr)
        sys.exit(2)
    if not args.scripts and not args.mjwarp and not args.kinetix:
        print("error: --scripts names no script, and --mjwarp and --kinetix are off: nothing to measure", file=sys.stderr)
        sys.exit(2)
    if args.kinetix_envs and not args.kinetix:
        print("error: --kinetix-envs: the Kinetix table needs --kinetix", file=sys.stderr)
        sys.exit(2)
    if args.kinetix:
        check_kinetix(args)
    if args.nproc < 1 or args.num_envs % args.nproc:
        print(f"error: --nproc {args.nproc} does not split --num-envs {args.num_envs} evenly", file=sys.stderr)
        sys.exit(2)
    if args.cuda:
        import torch  # noqa: PLC0415

        if not torch.cuda.is_available():
            print("error: --cuda: no CUDA device is visible (drop --cuda to train on the CPU)", file=sys.stderr)
            sys.exit(2)
        if torch.cuda.device_count() < args.nproc:  # each torchrun process trains on its own GPU (cuda:LOCAL_RANK)
            print(
                f"error: --cuda --nproc {args.nproc}: each torchrun process takes one GPU, and only "
                f"{torch.cuda.device_count()} GPU(s) are visible",
                file=sys.stderr,
            )
            sys.exit(2)
        if args.kinetix and not jax_gpus():
            print("error: --kinetix --cuda: JAX sees no GPU here (make kinetix-cuda installs its CUDA build)", file=sys.stderr)
            sys.exit(2)
    device = "cuda" if args.cuda else "cpu"
    print(
        f"machine: {os.cpu_count()} CPUs, device {device}; "
        f"{args.num_envs} envs x {args.num_steps} steps, {args.total_timesteps:,} steps per training run"
        + ("; training SPS after the first iteration (--steady)" if args.steady else "")
    )
    batch_size = args.num_envs * args.num_steps
    raw, observations, rows = {}, {}, []
    import torch  # noqa: PLC0415 - after the checks: --help and refusals stay fast

    torch.set_num_threads(1 if args.cuda else os.cpu_count() or 1)  # the direct timing: the training runs' threads
    for env_id in dict.fromkeys(task_of(args, script) for script in args.scripts):
        raw[env_id] = raw_envpool_sps(env_id, args.num_envs, args.raw_steps)
        observations[env_id] = real_observations(env_id, args.num_envs, min(args.metrics_batch, batch_size))
        blank = ("",) * (8 + 2 * len(args.candidates))
        rows.append((f"EnvPool raw rate, {env_id} (random actions)", f"{raw[env_id]:,.0f}", *blank))
    for script in args.scripts:
        env_id = task_of(args, script)
        frames, num_actions = observations[env_id]
        # setting -> (flags, metrics interval); "defaults, metrics off" gives the end-to-end cost of the metrics
        settings = {
            "eager": (EAGER_FLAGS.get(script, CLEANRL_EAGER), args.metrics_interval),
            "defaults": ((), args.metrics_interval),
        }
        settings |= {
            candidate: ([f"--{flag}" for flag in candidate.split()], args.metrics_interval) for candidate in args.candidates
        }
        settings["off"] = ((), 0)
        runs = {name: [] for name in settings}
        for _ in range(args.repeats):
            for name, (flags, interval) in settings.items():
                runs[name].append(training_sps(args, script, interval, flags=flags))
        sps = {name: over_succeeded(statistics.median, values) for name, values in runs.items()}
        seconds = metrics_seconds(script, frames, num_actions, batch_size, device)
        interval_seconds = args.metrics_interval * batch_size / sps["off"]
        check = finite_check_seconds(script, frames, batch_size, device)
        rows.append(
            (
                f"{script} ({env_id})",
                cell(sps["eager"]),
                cell(sps["defaults"]),
                *(cell(sps[candidate]) for candidate in args.candidates),
                cell(sps["defaults"] / sps["eager"], "{:.2f}"),
                *(cell(sps[candidate] / sps["eager"], "{:.2f}") for candidate in args.candidates),
                cell(sps["defaults"] / raw[env_id], "{:.3f}"),
                cell(sps["off"]),
                cell(100 * (1 - sps["defaults"] / sps["off"]), "{:+.1f} %"),
                cell(interval_seconds, f"{seconds:.3f} s / {{:.1f}} s = {100 * seconds / interval_seconds:.1f} %"),
                cell(
                    batch_size / sps["off"],
                    f"{check * 1e3:.2f} ms / {{:.2f}} s = {100 * check * sps['off'] / batch_size:.2f} %",
                ),
                "; ".join(f"{name} {', '.join(cell(x, '{:.0f}') for x in values)}" for name, values in runs.items()),
            )
        )
    candidates = [f"--{candidate.replace(' ', ' --')}" for candidate in args.candidates]
    if args.scripts:  # `--scripts` with no name: only the tables asked for below (--mjwarp, say)
        print(
            f"SPS with metrics every {args.metrics_interval} unless said; eager = CleanRL's path ({' '.join(CLEANRL_EAGER)})"
        )
        print_table(
            (
                "",
                "SPS eager",
                "SPS defaults",
                *(f"SPS {candidate}" for candidate in candidates),
                "defaults / eager",
                *(f"{candidate} / eager" for candidate in candidates),
                "defaults / raw",
                "SPS metrics off",
                "metrics cost end to end",
                "cost by direct timing (< 5 %)",
                "NaN check per iteration",
                "runs (SPS)",
            ),
            rows,
        )
    if args.nproc > 1:
        compare_torchrun(args)
    if args.jobs > 1:
        compare_thread_split(args)
    if args.mjwarp:
        compare_mujoco_backends(args)
    if args.kinetix:
        compare_kinetix(args)
    sys.exit(1 if FAILED_RUNS else 0)


def compare_thread_split(args: Args) -> None:
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    split = max(1, (os.cpu_count() or 1) // args.jobs)
    rows = []
    for script in args.scripts:
        per_run = {}
        for threads in (0, split):  # 0: torch's default, every core
            with ThreadPoolExecutor(args.jobs) as pool:
                runs = [pool.submit(training_sps, args, script, args.metrics_interval, 1, threads) for _ in range(args.jobs)]
                per_run[threads] = [run.result() for run in runs]
        default, divided = over_succeeded(statistics.mean, per_run[0]), over_succeeded(statistics.mean, per_run[split])
        rows.append(
            (
                f"{script} ({task_of(args, script)})",
                cell(default),
                cell(divided),
                cell(divided / default, "{:.2f}"),
                f"default {', '.join(cell(x, '{:.0f}') for x in per_run[0])}; "
                f"split {', '.join(cell(x, '{:.0f}') for x in per_run[split])}",
            )
        )
    print(
        f"\n{args.jobs} runs at once, metrics every {args.metrics_interval}: per-run SPS with torch's default threads "
        f"against {split} thread(s) each (OMP_NUM_THREADS, as sweeps/launch.sh sets for JOBS={args.jobs})"
    )
    print_table(("", "SPS per run, default threads", "SPS per run, split", "ratio", "runs (SPS)"), rows)


def warp_sps(num_envs: int, steps: int, device: str) -> float:
    """Batched steps per second of MuJoCo Warp's Ant (mujoco_warp_tasks.py) with uniformly random actions, after a first
    step that compiles or loads the kernels (and records the CUDA graph on a GPU)."""
    import torch  # noqa: PLC0415

    from mujoco_warp_tasks import WarpTasks  # noqa: PLC0415

    envs = WarpTasks("Ant", num_envs, seed=0, device=torch.device(device))
    envs.reset()
    low, high = (torch.as_tensor(bound, device=device) for bound in (envs.action_space.low, envs.action_space.high))
    actions = low + (high - low) * torch.rand(steps + 1, num_envs, len(low), device=device)
    envs.step(actions[0])
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    synchronize()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        envs.step(actions[step])
    synchronize()
    return steps * num_envs / (time.perf_counter() - start)


def compare_mujoco_backends(args: Args) -> None:
    """Ant on EnvPool (CPU) and on MuJoCo Warp (the training device): the simulators alone, then PPO end to end."""
    device = "cuda" if args.cuda else "cpu"
    ppo = {}
    for backend in ("envpool", "mjwarp"):
        flags = ["--backend", backend]
        runs = [training_sps(args, "ppo_isaacgym.py", args.metrics_interval, flags=flags) for _ in range(args.repeats)]
        ppo[backend] = over_succeeded(statistics.median, runs)
    rows = [
        ("EnvPool, Ant-v5 (CPU)", cell(raw_envpool_sps("Ant-v5", args.num_envs, args.raw_steps)), cell(ppo["envpool"])),
        (
            f"MuJoCo Warp, Ant ({device_name(device)})",
            cell(warp_sps(args.num_envs, args.warp_steps, device)),
            cell(ppo["mjwarp"]),
        ),
    ]
    print(
        f"\nAnt at {args.num_envs} envs: env steps/s of the simulator alone (random actions) and of PPO end to end "
        f"(ppo_isaacgym.py, {args.num_steps} steps a rollout, metrics every {args.metrics_interval})"
    )
    print_table(("", "env steps/s alone", "PPO SPS"), rows)


def check_kinetix(args: Args) -> None:
    """--kinetix's refusals, before any work (one line, exit 2): Kinetix is installed, each ppo_kinetix.py run times at
    least one iteration, and each batch splits into its minibatches."""
    error = ""
    if args.kinetix_iterations < 2 + args.steady:
        last = "the last, which evaluates the solve rate"
        left_out = f"the first, which compiles, and {last}, are" if args.steady else f"{last}, is"
        error = (
            f"--kinetix-iterations {args.kinetix_iterations}: at least {2 + args.steady}"
            f"{' with --steady' if args.steady else ''} ({left_out} not timed)"
        )
    flag = "--kinetix-envs" if args.kinetix_envs else "--num-envs"  # none given: --num-envs
    for envs in args.kinetix_envs or (args.num_envs,):
        if not error and envs * args.num_steps % KINETIX_MINIBATCHES:
            error = (
                f"{flag} {envs}: {envs} envs x --num-steps {args.num_steps} = {envs * args.num_steps} steps do not "
                f"split into ppo_kinetix.py's {KINETIX_MINIBATCHES} minibatches"
            )
    if not error and not all(importlib.util.find_spec(name) for name in ("jax", "kinetix")):
        error = "--kinetix: Kinetix is not installed (make setup installs it with JAX: requirements-nodeps.txt)"
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def kinetix_module():
    """ppo_kinetix.py, imported after the environment that JAX reads when it loads: no XLA warnings on loading cached
    code, and no 75 % of the GPU's memory taken at the first array (the training runs need it)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return importlib.import_module(KINETIX.removesuffix(".py"))


def jax_gpus() -> list:
    try:
        return kinetix_module().jax.devices("gpu")
    except RuntimeError:  # JAX's CPU build
        return []


def kinetix_sps(size: str, num_envs: int, steps: int, device: str) -> float:
    """Env steps per second of Kinetix alone: a KinetixTasks on the hand-designed levels of `size`, built as
    ppo_kinetix.main builds it (on torch's device, JAX's compilation cache that the script uses), stepped `steps` times
    with uniformly random MultiDiscrete actions (torch tensors of int64, as the policy's) after a first step that
    compiles the batched step or loads it from the cache. torch on 1 thread, as the script's --torch-threads."""
    import torch  # noqa: PLC0415

    ppo_kinetix = kinetix_module()
    jax = ppo_kinetix.jax
    args = ppo_kinetix.Args(task_set="handmade", env_size=size, num_envs=num_envs)
    os.makedirs(args.jax_cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", args.jax_cache_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.torch_threads)
    try:
        tasks = ppo_kinetix.task_set(args, "")
        envs = ppo_kinetix.KinetixTasks(tasks, num_envs, torch.device(device), seed=0)
        generator = torch.Generator().manual_seed(0)
        heads = [torch.randint(0, n, (steps + 1, num_envs), generator=generator) for n in ppo_kinetix.ACTION_SIZES]
        actions = torch.stack(heads, dim=-1).to(device)
        envs.start()
        envs.step(actions[0])
        synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
        synchronize()
        jax.block_until_ready(envs.states)
        start = time.perf_counter()
        for step in range(1, steps + 1):
            envs.step(actions[step])
        jax.block_until_ready(envs.states)  # JAX dispatches asynchronously: the clock stops when the last step is done
        return steps * num_envs / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def gpu_memory_peak(peaks: list[float]):
    """Append to `peaks` the most GPU memory in use while the block runs above its level at the start, in bytes, as
    cudaMemGetInfo counts it (the whole device: every process, JAX's memory and torch's), polled every 50 ms."""
    import torch  # noqa: PLC0415

    def used() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    start, done = used(), threading.Event()
    highest = [start]

    def poll() -> None:
        while not done.wait(0.05):
            highest[0] = max(highest[0], used())

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        peaks.append(max(highest[0], used()) - start)


def compare_kinetix(args: Args) -> None:
    """Kinetix alone and PPO end to end at each of --kinetix-envs on the training device, one after the other; on a
    GPU, the PPO run's peak memory too (the run first: Kinetix alone leaves memory in JAX's pool in this process)."""
    device = "cuda" if args.cuda else "cpu"
    rows = []
    for envs in args.kinetix_envs or (args.num_envs,):
        alone, ppo, peaks = [], [], []
        run = replace(args, num_envs=envs, total_timesteps=args.kinetix_iterations * envs * args.num_steps)
        for _ in range(args.repeats):
            with gpu_memory_peak(peaks) if args.cuda else contextlib.nullcontext():
                ppo.append(training_sps(run, KINETIX, args.metrics_interval))
            try:
                alone.append(kinetix_sps(args.kinetix_env_size, envs, args.kinetix_steps, device))
            except Exception as error:  # noqa: BLE001 - reported, not fatal: the other sizes still run
                print(f"failed: Kinetix alone at {envs} envs: {type(error).__name__}: {error}", file=sys.stderr)
                FAILED_RUNS.append(["Kinetix alone", envs])
                alone.append(math.nan)
        sps_alone, sps_ppo = over_succeeded(statistics.median, alone), over_succeeded(statistics.median, ppo)
        memory = [f"{max(peaks) / 2**30:.1f}"] if args.cuda else []
        rows.append((f"{envs} envs", cell(sps_alone), cell(sps_ppo), cell(sps_ppo / sps_alone, "{:.3f}"), *memory))
    timed = range(2 if args.steady else 1, args.kinetix_iterations)  # the last iteration evaluates the solve rate
    measured = sum(args.metrics_interval > 0 and iteration % args.metrics_interval == 0 for iteration in timed)
    iterations = f"iterations {timed.start} to {timed.stop - 1}" if len(timed) > 1 else f"iteration {timed.start}"
    print(
        f"\nKinetix, hand-designed {args.kinetix_env_size.upper()} levels, on {device_name(device)}: env steps/s of "
        f"Kinetix alone (random actions, {args.kinetix_steps} steps) and of PPO end to end (ppo_kinetix.py, "
        f"{args.num_steps} steps a rollout, {iterations} of {args.kinetix_iterations} timed, {measured} with metrics)"
    )
    memory = ["PPO peak GPU memory (GiB)"] if args.cuda else []
    print_table(("", "env steps/s alone", "PPO SPS", "PPO / alone", *memory), rows)


def device_name(device: str) -> str:
    import torch  # noqa: PLC0415

    return torch.cuda.get_device_name() if device == "cuda" else f"CPU, {os.cpu_count()} cores"


def compare_torchrun(args: Args) -> None:
    rows = []
    for script in [script for script in args.scripts if script in TORCHRUN_SCRIPTS]:
        one, many = [], []
        for _ in range(args.repeats):
            one.append(training_sps(args, script, args.metrics_interval))
            many.append(training_sps(args, script, args.metrics_interval, args.nproc))
        sps_one, sps_many = over_succeeded(statistics.median, one), over_succeeded(statistics.median, many)
        rows.append(
            (
                f"{script} ({task_of(args, script)})",
                cell(sps_one),
                cell(sps_many),
                cell(sps_many / sps_one, "{:.2f}"),
                f"1: {', '.join(cell(x, '{:.0f}') for x in one)}; {args.nproc}: {', '.join(cell(x, '{:.0f}') for x in many)}",
            )
        )
    print(
        f"\none run, metrics every {args.metrics_interval}: 1 process x {args.num_envs} envs against {args.nproc} torchrun "
        f"processes x {args.num_envs // args.nproc} envs "
        + ("(one GPU each)" if args.cuda else f"({max(1, (os.cpu_count() or 1) // args.nproc)} torch threads each)")
    )
    print_table(("", "SPS 1 process", f"SPS {args.nproc} processes", "ratio", "runs (SPS)"), rows)


def over_succeeded(statistic, values: list[float]) -> float:
    """`statistic` of the runs that succeeded, NaN if none did (statistics.median silently misorders a NaN)."""
    succeeded = [value for value in values if not math.isnan(value)]
    return statistic(succeeded) if succeeded else math.nan


def cell(value: float, template: str = "{:,.0f}") -> str:
    """`value` in a table cell; NaN (a failed run, or a ratio or cost that involves one) reads `failed`."""
    return "failed" if math.isnan(value) else template.format(value)


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
