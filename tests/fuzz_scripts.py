"""Random flags and signals against the training scripts on tiny budgets: a manual check, not part of `make test`.

    .venv/bin/python tests/fuzz_scripts.py flags --runs 400    # 1-3 flags at a time set to random (often bad) values
    .venv/bin/python tests/fuzz_scripts.py resume --runs 150   # a run's done.json removed, then --resume with random flags
    .venv/bin/python tests/fuzz_scripts.py signal --runs 100   # SIGTERM or SIGINT at a random moment, then --resume
    .venv/bin/python tests/fuzz_scripts.py flags --nproc 2 --workers 1 --runs 40   # each run as 2 torchrun processes

Every outcome must be exit 0; exit 1 or 2 with one `error:` line (or tyro's own panel for a flag it cannot parse); or,
for a signal, death by it before the script's handlers exist, else exit 128 + signal after which `--resume` finishes
the run. Never a Python traceback otherwise. Each failure is printed with its command; exit status 1 if any.
Under torchrun (--nproc), torchrun's own exit status (1 when a process failed) and its own traceback are allowed;
none of a project file, and every process that fails says the same one line.
"""

import argparse
import collections
import glob
import importlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import typing
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
ATARI = "--num-envs 2 --num-steps 16 --num-minibatches 2 --update-epochs 1 --max-episode-steps 40"
TINY = {  # each script's tiny run (--total-timesteps: 8 iterations)
    "ppo_atari_envpool.py": f"{ATARI} --total-timesteps 256",
    "ppo_ewma_atari.py": f"{ATARI} --total-timesteps 256",
    "pqn_atari.py": f"{ATARI} --total-timesteps 256",
    "ppo_rnd_atari.py": f"{ATARI} --total-timesteps 256 --num-iterations-obs-norm-init 1",
    "ppo_procgen.py": "--num-envs 4 --num-steps 16 --num-minibatches 2 --update-epochs 1 --total-timesteps 512",
    "ppo_isaacgym.py": "--backend envpool --env-id Ant --num-envs 4 --num-steps 16 --total-timesteps 512 "
    "--max-episode-steps 20",
    "ppo_kinetix.py": "--task-set handmade --env-size s --num-envs 16 --num-steps 32 --num-minibatches 8 "
    "--total-timesteps 1024 --num-tasks 16",  # a drawn --task-set: 16 tasks to evaluate, not 512 (~1 min at 16 envs)
}
LEFT_ALONE = {"runs_dir", "resume", "cuda", "cudagraphs", "exp_name", "track", "wandb_project_name", "wandb_entity"}
LEFT_ALONE |= {"jax_cache_dir"}  # a relative path would land in the working directory
INTS = ["0", "1", "2", "3", "5", "8", "16", "33", "64", "-1", str(2**31), str(10**12)]
FLOATS = ["0", "1e-9", "0.01", "0.5", "1", "1.5", "3", "-0.1", "nan", "inf", "1e30"]
ENV_IDS = {
    "ppo_procgen.py": ["BigfishEasy-v0", "StarpilotEasy-v0", "CoinrunHard-v0", "Breakout-v5", "bigfish"],
    "ppo_isaacgym.py": ["Ant", "Humanoid", "Hopper-v5", "HalfCheetah-v5", "Ant-v5", "Breakout-v5", "Cartpole"],
}
ATARI_IDS = ["Breakout-v5", "Pong-v5", "MontezumaRevenge-v5", "Breakout-v4", "CartPole-v1", ""]
SCHEDULES = ["0:2x16,0.5:4x8", "0:2x16,0.5:2x8,0.9:4x4", "0:4x4", "0.5:2x16", "0:2x16,0.99:2x8", "x", ""]


def random_words(script: str, name: str, kind, rng: random.Random) -> list[str]:
    """A flag's value as command-line words, drawn from its type's edge cases and a few good values."""
    if name == "total_timesteps":  # a valid huge budget would train for days
        return [rng.choice(["0", "1", "16", "33", "100", "300", "-1"])]
    if name in ("env_id", "schedule"):
        return [rng.choice(ENV_IDS.get(script, ATARI_IDS) if name == "env_id" else SCHEDULES)]
    if typing.get_origin(kind) is tuple:
        return [rng.choice(FLOATS) for _ in typing.get_args(kind)]
    if typing.get_origin(kind) is typing.Literal:
        return [rng.choice([*typing.get_args(kind), "bogus"])]
    types = set(typing.get_args(kind)) or {kind}  # int | None: {int, NoneType}
    choices = [words for type_, words in ((int, INTS), (float, FLOATS), (str, ["abc", "", "a/b"])) if type_ in types]
    return [rng.choice(choices[0] + (["None"] if type(None) in types else []))]


def random_flags(script: str, rng: random.Random) -> tuple[list[str], list[str]]:
    """The script's tiny flags (less --num-envs/--num-steps when --schedule is drawn) and 1-3 random flags."""
    extras = typing.get_type_hints(importlib.import_module(script[:-3]).Args, include_extras=True)
    hints = {name: typing.get_args(kind)[0] if typing.get_origin(kind) is Annotated else kind for name, kind in extras.items()}
    suppressed = {name for name, kind in extras.items() if tyro.conf.Suppress in typing.get_args(kind)[1:]}  # derived
    names = [name for name in hints if name not in LEFT_ALONE | suppressed]
    base, flags = TINY[script].split(), []
    for name in rng.sample(names, k=rng.choice([1, 2, 3])):
        flag = name.replace("_", "-")
        if hints[name] is bool:
            flags.append(rng.choice([f"--{flag}", f"--no-{flag}"]))
            continue
        if name == "schedule":
            drop = {i + k for i, word in enumerate(base) if word in ("--num-envs", "--num-steps") for k in (0, 1)}
            base = [word for i, word in enumerate(base) if i not in drop]
        flags += [f"--{flag}", *random_words(script, name, hints[name], rng)]
    return base, flags


def verdict(result: subprocess.CompletedProcess) -> str | None:
    """None for an accepted outcome, else what is wrong."""
    if NPROC > 1:  # torchrun exits 1 and prints its own traceback when a process fails; each process's line is the same
        if re.search(rf'File "{re.escape(ROOT)}/(?!\.venv/)[^"]+", line', result.stderr):  # torchrun's own is in .venv
            return f"exit {result.returncode} with a traceback of the project's"
        lines = [re.sub(r"^\[rank\d+\]:", "", line) for line in result.stderr.splitlines()]
        errors, tyro = {line for line in lines if line.startswith("error: ")}, any(line.startswith("╭") for line in lines)
        if result.returncode not in (0, 1) or (result.returncode == 1 and len(errors) != 1 and not tyro):
            return f"exit {result.returncode}, {len(errors)} different error lines"
        return None
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if "Traceback" in result.stderr or result.returncode not in (0, 1, 2):
        return f"exit {result.returncode}" + (" with a traceback" if "Traceback" in result.stderr else "")
    errors = [line for line in lines if line.startswith("error: ")]
    tyro = result.returncode == 2 and lines and lines[0].startswith("╭")
    return None if result.returncode == 0 or len(errors) == 1 or tyro else "not one error line"


NPROC = 1  # --nproc: processes of each run (torchrun's) in every mode


def python(script: str, *flags: str) -> list[str]:
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}"] if NPROC > 1 else []
    return [sys.executable, *torchrun, os.path.join(ROOT, script), "--no-cuda", *flags]


ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
ENV["PYTHONPATH"] = os.path.join(ROOT, "tests", "startup")  # EnvPool's unused task families left out (as in the tests)


def run(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)  # noqa: PLW1510
    except subprocess.TimeoutExpired as timeout:  # a tiny run takes seconds: a hang
        return subprocess.CompletedProcess(command, "(no exit after 300 s)", "", str(timeout.stderr or ""))


def flags_trial(script: str, runs: str, rng: random.Random) -> tuple[str | None, list[str], str, str]:
    """A tiny run with random flags. Each trial returns (what is wrong or None, the command, its stderr's end, the outcome)."""
    base, flags = random_flags(script, rng)
    command = python(script, "--torch-threads", "1", *base, *flags, "--runs-dir", runs)
    result = run(command)
    return verdict(result), command, result.stderr[-800:], f"exit {result.returncode}"


def resume_trial(script: str, runs: str, rng: random.Random) -> tuple[str | None, list[str], str, str]:
    """A tiny run that checkpoints every iteration, its done.json removed, then --resume with random flags."""
    first = python(script, "--torch-threads", "1", *TINY[script].split(), "--runs-dir", runs, "--checkpoint-interval", "1")
    if (result := run(first)).returncode != 0:
        return "the run to resume failed", first, result.stderr[-800:], ""
    checkpoint = glob.glob(os.path.join(runs, "*", "checkpoint.pt"))[0]
    os.remove(os.path.join(os.path.dirname(checkpoint), "done.json"))
    command = python(script, "--resume", checkpoint, *random_flags(script, rng)[1])
    result = run(command)
    return verdict(result), command, result.stderr[-800:], f"exit {result.returncode}"


def signal_trial(script: str, runs: str, rng: random.Random) -> tuple[str | None, list[str], str, str]:
    """A tiny run signalled after 0-9 s; stopped by it, the run must have a checkpoint and --resume must finish it."""
    first = python(script, "--torch-threads", "1", *TINY[script].split(), "--runs-dir", runs)
    first += rng.choice([[], ["--save-embeddings"], ["--save-model"], ["--checkpoint-interval", "3"]])
    signum = rng.choice([signal.SIGTERM, signal.SIGINT])
    process = subprocess.Popen(first, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(rng.uniform(0, 9))
    process.send_signal(signum)
    command = [*first, f"(then {signum.name})"]
    try:
        stderr = process.communicate(timeout=300)[1]
    except subprocess.TimeoutExpired:  # a hang after the signal
        process.kill()
        return "no exit 300 s after the signal", command, process.communicate()[1][-800:], ""
    if process.returncode == -signum:  # before the script's handlers: Python's own end (a KeyboardInterrupt's too)
        return None, command, "", "killed during its imports"
    starting = process.returncode == 1 and stderr.rstrip().endswith("KeyboardInterrupt")  # CPython's exit 1 in `site`
    if signum == signal.SIGINT and starting and not re.search(rf'File "{re.escape(ROOT)}/(?!\.venv/|tests/)', stderr):
        return None, command, "", "interrupted while Python started"
    if process.returncode != 128 + signum:
        result = subprocess.CompletedProcess(first, process.returncode, "", stderr)
        return verdict(result), command, stderr[-800:], f"exit {process.returncode}, not stopped"
    if not (checkpoints := glob.glob(os.path.join(runs, "*", "checkpoint.pt"))):
        return "stopped by the signal without a checkpoint", command, stderr[-800:], ""
    resumed = run(python(script, "--resume", checkpoints[0]))
    done = glob.glob(os.path.join(runs, "*", "done.json"))
    wrong = None if resumed.returncode == 0 and done else "the resume failed"
    return wrong, command, resumed.stderr[-800:], "stopped, then resumed to the end"


TRIALS = {"flags": flags_trial, "resume": resume_trial, "signal": signal_trial}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=list(TRIALS))
    parser.add_argument("--runs", type=int, default=100, help="trials, each on a script drawn at random")
    parser.add_argument("--scripts", nargs="+", default=list(TINY), choices=list(TINY))
    parser.add_argument("--workers", type=int, default=2, help="trials at once (one torch thread each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=1, help="run each script as this many torchrun processes")
    args = parser.parse_args()
    if args.nproc > 1 and args.mode == "signal":  # a signal to torchrun itself ends in its own traceback (documented)
        parser.error("--nproc: the flags and resume modes only")
    global NPROC  # noqa: PLW0603 - set once, before any trial
    NPROC = args.nproc
    if NPROC > 1 and args.mode == "resume":  # PQN and PPO+RND refuse torchrun in one line: no run to resume
        args.scripts = [script for script in args.scripts if script not in ("pqn_atari.py", "ppo_rnd_atari.py")]
    scripts = random.Random(args.seed).choices(args.scripts, k=args.runs)

    def one(index: int) -> str:  # trial i draws from its own generator: a seed repeats the same trials
        with tempfile.TemporaryDirectory() as runs:
            wrong, command, stderr, outcome = TRIALS[args.mode](scripts[index], runs, random.Random(f"{args.seed}:{index}"))
        if wrong:
            print(f"FAILED ({wrong}): {' '.join(command)}\n{stderr}", flush=True)
        return f"FAILED: {wrong}" if wrong else outcome

    with ThreadPoolExecutor(args.workers) as pool:
        outcomes = collections.Counter(pool.map(one, range(args.runs)))
    failures = sum(count for outcome, count in outcomes.items() if outcome.startswith("FAILED"))
    print(f"{args.mode}: {args.runs} trials, {failures} failed; " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
