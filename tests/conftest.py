"""Helpers shared by the tests: run a script, read its TensorBoard scalars, run its maths on fake CUDA tensors."""

import importlib.util

if importlib.util.find_spec("isaacgym"):  # before torch, as in ppo_isaacgym.py: Isaac Gym refuses to load after torch
    import isaacgym  # noqa: F401

import ast
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.fx.experimental._config
import tqdm
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every process the tests start (the scripts, torchrun's workers, the benchmarks' and sweeps' runs) inherits this
# environment: tests/startup/sitecustomize.py leaves EnvPool's task families that no script uses unregistered, which
# saves about a second of imports per process, and makes torch's optimizers wait for Dynamo's import, 2 s more (its
# docstring says why and how to turn each off).
STARTUP = os.path.join(ROOT, "tests", "startup")
os.environ["PYTHONPATH"] = os.pathsep.join([STARTUP, *filter(None, [os.environ.get("PYTHONPATH")])])
# One torch (OpenMP) thread per process, this one included. The tests' batches are tiny (a minibatch of 16 frames): a
# second thread buys nothing there, and while a test process waits for another (torchrun's workers, the benchmark's
# concurrent runs, or other jobs on a shared machine) the threads of an OpenMP team spin: 20 iterations of
# ppo_isaacgym.py's tiny run took 63 s of CPU with 2 threads against 9 s with 1 on a busy 2-core machine. No test
# measures throughput; the ones about thread counts (sweeps/launch.sh's split, benchmarks/sps.py's tables) set or
# clear OMP_NUM_THREADS themselves.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
# `python3` in the processes the tests start (sweeps/launch.sh compares flags and checks locks with it, several times a
# command) is this interpreter's, as in an activated venv: a version manager's shim (pyenv's is a bash script) took
# 137 ms a call against 14 ms on the development machine, about a minute of the suite.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

# Every tag of the SPEC that ppo_atari_envpool.py writes.
PPO_TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "metrics/feature_rank",
    "metrics/dormant_pct",
    "metrics/weight_norm",
    "metrics/grad_kurtosis",
    "metrics/grad_norm",
    "metrics/ess_pct",
    "metrics/policy_variance",
    "metrics/kl_behavior",
    "metrics/ddr",
}


def run_script(script, *flags, env=None, timeout=600, cuda=False):
    """Run a project script with the CPU forced (every GPU hidden unless `cuda`); return the CompletedProcess."""
    full_env = {**os.environ, **({} if cuda else {"CUDA_VISIBLE_DEVICES": ""}), "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run(  # noqa: PLW1510 - callers assert on the return code
        [sys.executable, os.path.join(ROOT, script), *flags],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )


# Recognisable normaliser statistics planted in a checkpoint before --resume: a resume test's run is interrupted after
# its first iteration or two, so a normaliser restarted from its prior would also end with more than the interrupted
# run's count; against 1e6 it ends far below, and one that counts a step twice ends above the test's bound.
PLANTED = {"count": 1e6, "mean": 100.0, "var": 400.0}


def plant_statistics(checkpoint_path, *names):
    """Overwrite the checkpoint's normalisers `names` (e.g. "return_rms") with PLANTED, same dtypes and shapes (data
    for weights_only); returns the checkpoint's iteration."""
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    for name in names:
        checkpoint[name] = {key: torch.full_like(value, PLANTED[key]) for key, value in checkpoint[name].items()}
    torch.save(checkpoint, checkpoint_path)
    return checkpoint["iteration"]


def only_run_dir(runs_dir):
    run_dirs = [d for d in glob.glob(os.path.join(runs_dir, "*")) if os.path.isdir(d)]
    assert len(run_dirs) == 1, run_dirs
    return run_dirs[0]


# Two iterations of 2 x 16, then from step 64 a phase of 8 envs x 10**9 steps: its frames (210,285 GiB) are more than any
# host or GPU holds, and than x86-64's 128 TiB of address space: torch's allocation fails in start_phase.
TOO_BIG_PHASE = ["--schedule", "0:2x16,0.000000008:8x1000000000", "--total-timesteps", "8000000064", "--torch-threads", "1"]


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} sorted by step, from sweeps/aggregate.py's reader."""
    from sweeps.aggregate import read_scalars as read_tensorboard

    return {
        tag: list(zip(steps.tolist(), values.tolist(), strict=True))
        for tag, (steps, values) in read_tensorboard(run_dir).items()
    }


def run_main(monkeypatch, script, argv):
    """The `script` module's main() in-process with `argv`, then put back what a script sets: torch's threads and the
    stop handlers. In-process, as importing torch and EnvPool for every run would add seconds to each."""
    threads = torch.get_num_threads()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(sys, "argv", [script.__file__, *argv])
    try:
        script.main()
    finally:
        torch.set_num_threads(threads)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def assert_optimizer_went_on(final_checkpoint: dict) -> None:
    """The final checkpoint's optimizer has a step for every minibatch of every iteration, those before a resume
    included: a resume that restarted the optimizer (and the weights with it) counts only its own."""
    args = final_checkpoint["args"]
    expected = final_checkpoint["iteration"] * args["update_epochs"] * args["num_minibatches"]
    assert {int(state["step"]) for state in final_checkpoint["optimizer"]["state"].values()} == {expected}


def check_same_losses(
    monkeypatch,
    tmp_path,
    script,
    flags,
    variants,
    tags,
    compile_backend="inductor",
    abs_tolerance=1e-6,
    rel_tolerance=1e-3,
):
    """Run the `script` module's main() with `flags` as is and with each variant's extra flags ({name: flags}): flags
    that change how the same maths runs (--compile, --no-channels-last) must log the default run's losses up to float
    rounding. compile_backend "aot_eager" traces and differentiates the same graphs as --compile without inductor's
    code generation, which costs tens of seconds per script on a cold cache: every script's test uses it (inductor
    runs in the CUDA tests on a GPU machine). Returns {run name: {tag: [(step, value), ...]}}."""
    import functools

    compile_function = (
        torch.compile if compile_backend == "inductor" else functools.partial(torch.compile, backend=compile_backend)
    )
    compiled = []  # what each run compiled: --compile must compile something (equal losses alone pass if it is ignored)
    monkeypatch.setattr(
        torch, "compile", lambda *args, **kwargs: compiled.append(args[0]) or compile_function(*args, **kwargs)
    )
    logged = {}
    for name, extra in {"default": [], **variants}.items():
        compiled.clear()
        run_main(monkeypatch, script, [*flags, *extra, "--runs-dir", str(tmp_path / name)])
        logged[name] = read_scalars(only_run_dir(tmp_path / name))
        assert bool(compiled) == ("--compile" in extra), (name, compiled)
    for name in variants:
        for tag in tags:
            expected = [value for _, value in logged["default"][tag]]
            logged_values = [value for _, value in logged[name][tag]]
            assert logged_values == pytest.approx(expected, rel=rel_tolerance, abs=abs_tolerance), (name, tag)
    return logged


# How far --bf16's losses may be from float32's in a tiny run, per tag: (first, later), the largest difference at the
# first iteration and at the later ones, as fractions of the tag's scale: its largest magnitude over the float32 run's
# iterations. The entropy of a near-uniform policy sits near log(number of actions), a size that says nothing about its
# digits: its scale is its largest move from its first value, and BF16_ENTROPY_FLOOR nats are added. At the first
# iteration both runs start from the same weights and (bar a near-tie in an action draw) collect the same rollout; later
# rollouts may differ. Measured on seeds 1-6 of every script's bf16 test (36 pairs of runs), the largest differences, in
# those fractions, at the first iteration: policy_loss 0.125 (PPO, seed 4), approx_kl 0.077 (Procgen, seed 5),
# value_loss 0.034, td_loss and q_values 0.014, rnd_loss 3e-5; entropy 9e-6 nats (Isaac Gym's Gaussian: 1e-3 nats).
# Later: policy_loss 1.03 (PPO, seed 5, whose policy losses are all under 6e-4), approx_kl 0.87 beyond Isaac Gym's
# rel_tolerance, value_loss 0.11, entropy 1.6e-4 nats (Isaac Gym: 3e-2). No difference used more than 0.52 of its
# tolerance; the blanket 2 % (5e-4 near 0) that came before failed 11 of the 36. A broken --bf16 moves them, at the first
# iteration of Breakout PPO's seeds 1-3: the heads in bfloat16, the entropy by 1.1e-3 to 3.9e-3 nats; frames read
# transposed, policy_loss by 0.36 to 2.3, value_loss by 0.12 to 0.31; no / 255, everything by orders of magnitude.
BF16_TOLERANCES = {"losses/policy_loss": (0.3, 2.0), "losses/approx_kl": (0.25, 2.0), "losses/entropy": (0.1, 0.3)}
BF16_VALUE_TOLERANCE = (0.1, 0.3)  # every other tag: the value, TD and RND losses, the Q-values
BF16_ENTROPY_FLOOR = 5e-4


def bf16_mismatches(fp32, bf16, tags, rel_tolerance):
    """[(tag, iteration, |bf16 - fp32|, tolerance)] for each logged value of --bf16 (bf16: {tag: [(step, value), ...]})
    further from float32's (fp32) than BF16_TOLERANCES allows, with rel_tolerance x the value's size added at the later
    iterations."""
    mismatches = []
    for tag in tags:
        expected, logged = ([value for _, value in run[tag]] for run in (fp32, bf16))
        assert len(logged) == len(expected), tag
        entropy = tag == "losses/entropy"
        sizes = [abs(value - expected[0]) if entropy else abs(value) for value in expected]
        first, later = BF16_TOLERANCES.get(tag, BF16_VALUE_TOLERANCE)
        floor = BF16_ENTROPY_FLOOR if entropy else 0.0
        for iteration, (value, bf16_value, size) in enumerate(zip(expected, logged, sizes, strict=True), 1):
            scaled = first * max(sizes) if iteration == 1 else later * max(sizes) + rel_tolerance * size
            if not abs(bf16_value - value) <= floor + scaled:  # a NaN fails too
                mismatches.append((tag, iteration, abs(bf16_value - value), floor + scaled))
    return mismatches


def check_bf16(monkeypatch, tmp_path, script, flags, tags, rel_tolerance=0.02):
    """--bf16 rounds the encoders' arithmetic to bfloat16's 8-bit mantissa (float32 has 24): over the tiny run's
    iterations its losses stay within BF16_TOLERANCES of float32's, each relative to the loss's own scale (rel_tolerance
    x each value is added after the first iteration: 0.5 where the rollouts drift apart from the first step, as
    ppo_isaacgym.py's continuous actions do), and differ from them (bfloat16 really ran). A checkpoint written in either
    mode resumes in the other: weights and optimizer state are float32 in both."""
    logged = {}
    for name, extra in {"default": [], "bf16": ["--bf16"]}.items():
        run_main(monkeypatch, script, [*flags, *extra, "--runs-dir", str(tmp_path / name)])
        logged[name] = read_scalars(only_run_dir(tmp_path / name))
    mismatches = bf16_mismatches(logged["default"], logged["bf16"], tags, rel_tolerance)
    assert not mismatches, mismatches  # (tag, iteration, difference, tolerance)
    assert any(logged["bf16"][tag] != logged["default"][tag] for tag in tags)
    for written, resumed in ((["--bf16"], []), ([], ["--bf16"])):
        runs_dir = tmp_path / f"written{'_bf16' * bool(written)}"
        stop_after_first_checkpoint(monkeypatch, script, [*flags, *written, "--runs-dir", str(runs_dir)])
        run_dir = only_run_dir(runs_dir)
        run_main(monkeypatch, script, ["--resume", os.path.join(run_dir, "checkpoint.pt"), *resumed])
        planned = json.load(open(os.path.join(run_dir, "args.json")))
        done = json.load(open(os.path.join(run_dir, "done.json")))
        iterations = planned["num_iterations"]  # of one batch size: these runs have no --schedule
        assert done == {"global_step": iterations * planned["batch_size"], "iterations": iterations}, written
    return logged


def stop_after_first_checkpoint(monkeypatch, script, argv):
    """script.main() in-process with --checkpoint-interval 1, sent SIGTERM (as a pre-emption would) once its first
    checkpoint is written: it must save and exit 128 + SIGTERM."""
    original, stopped = script.save_checkpoint, []

    def save_then_stop(*args, **kwargs):
        original(*args, **kwargs)
        if not stopped:
            stopped.append(os.kill(os.getpid(), signal.SIGTERM))

    monkeypatch.setattr(script, "save_checkpoint", save_then_stop)
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, script, [*argv, "--checkpoint-interval", "1"])
    assert exit_info.value.code == 128 + signal.SIGTERM
    monkeypatch.setattr(script, "save_checkpoint", original)


def check_a_discarded_rollout_leaves_the_normalisers(monkeypatch, script, argv, names):
    """SIGTERM after the first checkpoint (iteration 1): the rollout under way runs to its end and is discarded, so the
    normalisers `names` of the checkpoint written on the stop are those of iteration 1's end, as a resume needs them."""
    saved, save = [], script.save_checkpoint

    def save_and_record(*args, **modules):
        saved.append({name: {k: v.clone() for k, v in modules[name].state_dict().items()} for name in names})
        save(*args, **modules)

    monkeypatch.setattr(script, "save_checkpoint", save_and_record)
    stop_after_first_checkpoint(monkeypatch, script, argv)
    assert len(saved) == 2  # iteration 1's, and the one written on the stop
    for name in names:
        for key, value in saved[0][name].items():
            assert torch.equal(saved[1][name][key], value), (name, key)


# A few iterations of 2 envs x 16 steps; a 40-step time limit guarantees finished games.
TINY_PPO_FLAGS = (
    "--no-cuda",
    "--num-envs",
    "2",
    "--num-steps",
    "16",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--total-timesteps",
    "256",
    "--max-episode-steps",
    "40",
    "--metrics-interval",
    "2",
    "--metrics-batch",
    "24",
)


@pytest.fixture
def tiny_ppo_flags():
    """TINY_PPO_FLAGS as a list a test may change."""
    return list(TINY_PPO_FLAGS)


def with_schedule(flags, schedule):
    """The flags with --schedule instead of their --num-envs and --num-steps (a script refuses both)."""
    drop = {i + offset for i, flag in enumerate(flags) if flag in ("--num-envs", "--num-steps") for offset in (0, 1)}
    return [flag for i, flag in enumerate(flags) if i not in drop] + ["--schedule", schedule]


@pytest.fixture(autouse=True)
def close_progress_bars():
    """A script's main() run in-process that ends in fail() leaves its progress bar open; closed later, when it is
    garbage-collected, it would print its last line into whichever test runs then (whose stdout must be empty)."""
    yield
    for bar in list(tqdm.tqdm._instances):
        bar.close()


@pytest.fixture(autouse=True)
def restore_stop_handlers():
    """A script's main() run in-process installs its own SIGTERM and SIGINT handlers (a stop request); put pytest's
    back after each test, or Ctrl-C no longer stops the session."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def run_twice(script, runs_dir, flags, first_flags=(), first_env=None):
    """Two runs of `script` with the same `flags` (the first also with `first_flags`: flags that only add artifacts),
    in runs_dir/first and runs_dir/second; asserts that both exit 0 and returns their CompletedProcess and run
    directory: [(result, run_dir), (result, run_dir)]. For a module-scoped fixture whose first run serves the tiny-run
    test and both the reproducibility test: one process start fewer than a tiny run plus two seeded runs."""
    runs = []
    for name, extra, env in (("first", first_flags, first_env), ("second", (), None)):
        result = run_script(script, *flags, *extra, "--runs-dir", str(runs_dir / name), env=env)
        assert result.returncode == 0, result.stderr
        runs.append((result, only_run_dir(runs_dir / name)))
    return runs


def usage_error(main, monkeypatch, capsys, argv):
    """Run a script's main() in-process; it must exit 2 with one "error: ..." line and no stdout.

    Returns that line. In-process because importing torch and EnvPool once is much faster
    than once per bad flag; each test_<script>.py also checks the real command line.
    """
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert captured.out == ""
    return lines[0]


def refused_over_two_processes(script, monkeypatch, capsys, args) -> str:
    """The script's validate_and_derive(args) as each of 2 torchrun processes runs it (its WORLD_SIZE set to 2): it
    must exit 2 with one line on stderr, which is returned. The real torchrun launch is ppo_atari_envpool.py's test."""
    monkeypatch.setattr(script, "WORLD_SIZE", 2)
    with pytest.raises(SystemExit) as stop:
        script.validate_and_derive(args)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def tyro_error(main, monkeypatch, capsys, argv):
    """A flag tyro itself rejects (unknown flag, wrong type or choice): exit 2 and tyro's own
    message on stderr, no traceback, nothing on stdout. Returns stderr."""
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err


def torchrun(nproc):
    """The command prefix that runs a script as `nproc` processes of one run (Gloo on the CPU)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def run_torchrun(script, nproc, *flags, timeout=600, cuda=False):
    """run_script under torchrun, one torch thread per process (each on its own GPU with `cuda`)."""
    env = {**os.environ, **({} if cuda else {"CUDA_VISIBLE_DEVICES": ""}), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    command = [*torchrun(nproc), os.path.join(ROOT, script), *flags]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)  # noqa: PLW1510


def interrupt_with_sigterm(script, flags, wait_for=None, nproc=0):
    """Start a script (under torchrun with `nproc` processes if given) and send SIGTERM once it
    has run an iteration: when a stdout line starts with `wait_for`, or else when
    --checkpoint-interval 1 (added here) has written the first checkpoint.pt. It must save and
    exit 128 + SIGTERM (torchrun itself then exits 1). Returns its stdout."""
    runs_dir = flags[flags.index("--runs-dir") + 1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", **({"OMP_NUM_THREADS": "1"} if nproc else {})}
    launcher = torchrun(nproc) if nproc else [sys.executable]
    command = [*launcher, script, *flags, *([] if wait_for else ["--checkpoint-interval", "1"])]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait_for:
        for line in process.stdout:
            if line.startswith(wait_for):
                break
    else:
        deadline = time.time() + 300
        while not glob.glob(os.path.join(runs_dir, "*", "checkpoint.pt")) and process.poll() is None:
            assert time.time() < deadline, "no checkpoint after 300 s"
            time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=300)
    if nproc and process.returncode == -signal.SIGABRT:
        # torchrun (torch 2.13) now and then aborts in its own teardown, after it has stopped its workers (once in CI,
        # 2026-11-29: "terminate called without an active exception"): what is checked then is what the workers did.
        assert "terminate called without an active exception" in stderr and stderr.count("closing signal SIGTERM") == nproc
    else:
        assert process.returncode == (1 if nproc else 128 + signal.SIGTERM), stderr
    assert "--resume" in stdout
    assert not glob.glob(os.path.join(runs_dir, "*", "done.json"))  # interrupted: no completion marker
    return stdout


@pytest.fixture(scope="session")
def kinetix_step():
    """A KinetixTasks of test_ppo_kinetix.py's TINY (16 envs of Kinetix's 10 hand-designed S levels), its batched step
    compiled into JAX's persistent cache (ppo_kinetix.py's) by one test process at a time: an exclusive lock beside
    the cache. On a cold cache the first process compiles it (~25 s alone, ~50 s in the suite, 2 cores) while the
    other waits, then loads it, where both compiled it at once before; the scripts' runs started later (under
    torchrun too) load it as well. Each test process keeps this one, already traced: a test that steps it starts it
    first."""
    import fcntl

    pytest.importorskip("kinetix", reason="needs Kinetix (make setup: requirements-nodeps.txt)")
    import ppo_kinetix

    args = ppo_kinetix.Args(task_set="handmade", env_size="s", num_envs=16)
    os.makedirs(args.jax_cache_dir, exist_ok=True)
    ppo_kinetix.jax.config.update("jax_compilation_cache_dir", args.jax_cache_dir)
    with open(os.path.join(args.jax_cache_dir, "tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        tasks = ppo_kinetix.task_set(args, "", handmade=True)
        envs = ppo_kinetix.KinetixTasks(tasks, args.num_envs, torch.device("cpu"), seed=0)
        envs.start()
        envs.step(torch.zeros(args.num_envs, len(ppo_kinetix.ACTION_SIZES), dtype=torch.long))
    return envs


def fake_wandb(runs_dir):
    """--track against tests/fake_wandb (the real W&B's offline start and finish add about 9 s to a tiny run): the flag,
    and the environment of a run whose W&B calls go to runs_dir/wandb_calls.jsonl, which check_run_artifacts reads."""
    fake = os.path.join(ROOT, "tests", "fake_wandb")
    env = {"PYTHONPATH": os.pathsep.join([fake, os.environ["PYTHONPATH"]])}
    return ["--track"], env | {"FAKE_WANDB_LOG": os.path.join(runs_dir, "wandb_calls.jsonl")}


def check_run_artifacts(
    run_dir, exp_name, iterations, global_step, metric_iterations, embedding_rows, feature_dim=512, video=True, tracked=False
):
    """What --checkpoint-interval, --save-model, --save-embeddings, --capture-video and --track leave behind: the folder
    of W&B's offline run (`tracked=True`: ppo_atari_envpool.py's test), or (`tracked="fake"`) tests/fake_wandb's calls."""
    import numpy as np
    import torch

    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)  # plain data only
    assert checkpoint["iteration"] == iterations and checkpoint["global_step"] == global_step
    with open(os.path.join(run_dir, "done.json")) as marker:
        assert json.load(marker) == {"global_step": global_step, "iterations": iterations}
    model = torch.load(os.path.join(run_dir, f"{exp_name}.cleanrl_model"), weights_only=True)
    if "obs_rms" in model:  # ppo_isaacgym.py keeps the observation statistics with the weights
        model = model["model"]
    assert set(model) == set(checkpoint["model"])
    embeddings = np.load(os.path.join(run_dir, "embeddings.npz"))
    assert embeddings["features"].shape == (embedding_rows, feature_dim) and embeddings["values"].shape == (embedding_rows,)
    assert sorted(set(embeddings["iteration"].tolist())) == list(metric_iterations)
    if video:
        videos = os.listdir(os.path.join(run_dir, "videos"))
        assert any(name.endswith(".mp4") for name in videos), videos
    assert os.path.isdir(os.path.join(run_dir, "wandb")) == (tracked is True)
    if tracked is True and video:  # W&B's offline run holds the video, to be synced with the charts
        assert glob.glob(
            os.path.join(run_dir, "wandb", "offline-run-*", "files", "media", "videos", "**", "*.mp4"), recursive=True
        )
    if tracked == "fake":  # the run started W&B, then logged its video
        calls = os.path.join(os.path.dirname(run_dir), "wandb_calls.jsonl")
        start = {"call": "init", "name": os.path.basename(run_dir), "dir": run_dir, "sync_tensorboard": True}
        video = {"call": "log", "videos/eval": {"video": os.path.join(run_dir, "videos", "eval.mp4"), "format": "mp4"}}
        assert [json.loads(line) for line in open(calls)] == [start, video]
    return checkpoint


# --------------------------------------------------------------------------------------
# The CUDA path on a machine without a GPU
# --------------------------------------------------------------------------------------

# The GPU of the tests below: tensors on another device than the CPU, with shapes and dtypes but no data. FakeTensorMode's
# "cuda" tensors would be closer, but a CPU-only build of torch cannot index them (Python indexing takes a CUDA device
# guard) nor build an autograd graph on them; meta tensors can do both, and HostSyncs checks what CUDA would.
GPU = torch.device("meta")


class HostSyncs(TorchDispatchMode):
    """Sees every tensor operation: fails on one whose tensor arguments lie on two devices (which CUDA refuses) and
    records, in `calls`, those that make the host wait for the GPU: reading a value (item, bool, int), a copy to the
    host, a copy to the device without non_blocking=True, an output whose size depends on the values (nonzero, boolean
    indexing) and CUDA's multinomial, whose kernel checks its input on the host. A value read from the GPU is a
    stand-in (there is no data): False, 1 or 0.5, and a tensor copied to the host holds ones (True: a script's check
    that its losses are finite passes). With `watch`, a function's code object, `lines` holds the line that function
    was on at each call (None where it was not running)."""

    SYNCING = {"_local_scalar_dense", "item", "equal", "nonzero", "masked_select", "multinomial", "unique"}

    def __init__(self, watch=None):
        super().__init__()
        self.calls: list[str] = []
        self.watch, self.lines = watch, []

    def record(self, call: str) -> None:
        self.calls.append(call)
        if self.watch is not None:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code is not self.watch:
                frame = frame.f_back
            self.lines.append(frame and frame.f_lineno)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        on_gpu = any(tensor.device == GPU for tensor in tensors)
        if name == "copy_" and args[0].device.type == "cpu" and args[1].device == GPU:
            self.record("copy to the host")
            return args[0]
        if name in ("_to_copy", "to") and on_gpu and torch.device(kwargs.get("device", GPU)).type == "cpu":  # "to" of an
            self.record("copy to the host")  # inference tensor
            return torch.ones(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        if name in ("copy_", "_to_copy"):  # from the host without non_blocking=True: waits for all the GPU has queued
            source, destination = (args[1], args[0].device) if name == "copy_" else (args[0], kwargs.get("device"))
            if source.device.type == "cpu" and destination == GPU and not (kwargs.get("non_blocking") or args[2:] == (True,)):
                self.record("blocking copy to the device")
        if name not in ("copy_", "_to_copy", "to"):  # the operations that may move data between devices
            assert len({tensor.device for tensor in tensors}) <= 1, f"{func} mixes the devices of {tensors}"
        boolean_index = name == "index" and any(tensor.dtype == torch.bool for tensor in tensors[1:])
        if on_gpu and (name in self.SYNCING or boolean_index):
            self.record(name)
            if name == "_local_scalar_dense":
                return False if args[0].dtype == torch.bool else 0.5 if args[0].is_floating_point() else 1
        return func(*args, **kwargs)


def on_cuda(device) -> bool:
    """Whether a device argument (a torch.device, a string or anything else) names CUDA."""
    return isinstance(device, (str, torch.device)) and str(device).split(":")[0] == "cuda"


class FakeCuda(HostSyncs):
    """HostSyncs behind a stand-in CUDA (see fake_cuda): an operation told device "cuda" makes (or moves) its tensor on
    GPU instead, and pinned host memory is plain host memory (a CPU-only torch cannot pin)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = {**(kwargs or {}), **({"device": GPU} if on_cuda((kwargs or {}).get("device")) else {})}
        kwargs.pop("pin_memory", None)
        if func.overloadpacket.__name__ == "_pin_memory":
            return args[0].clone()
        return super().__torch_dispatch__(func, types, args, kwargs)


@contextlib.contextmanager
def fake_cuda(monkeypatch, watch=None):
    """A GPU for a script's main() on a machine without one: torch.cuda says there is one, torch.device("cuda") is
    FakeCuda's GPU, and the FakeCuda (`watch` as HostSyncs takes it) is yielded. The paths that a CPU-only torch
    resolves before the dispatch are routed to it: a "cuda" without an index (Tensor.to) and data made on a device
    (torch.tensor, torch.as_tensor). A value-dependent size (nonzero, boolean indexing) takes every element."""

    def first_gpu(to):
        def to_gpu(self, *args, **kwargs):
            args = [torch.device("cuda:0") if on_cuda(arg) else arg for arg in args]
            return to(self, *args, **{k: torch.device("cuda:0") if on_cuda(v) else v for k, v in kwargs.items()})

        return to_gpu

    def made_on_the_host(make):
        def make_then_move(data, *args, device=None, **kwargs):
            return make(data, *args, **kwargs).to(device) if on_cuda(device) else make(data, *args, device=device, **kwargs)

        return make_then_move

    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "_lazy_init", lambda: None)
        patch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
        patch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.zeros(16, dtype=torch.uint8))
        patch.setattr(torch.Tensor, "to", first_gpu(torch.Tensor.to))
        for name in ("tensor", "as_tensor"):
            patch.setattr(torch, name, made_on_the_host(getattr(torch, name)))
        with torch.fx.experimental._config.patch(meta_nonzero_assume_all_nonzero=True), FakeCuda(watch) as syncs:
            yield syncs


def step_loop_lines(module) -> range:
    """The source lines of the loop over a rollout's steps (`for step in ...`) in `module`.main()."""
    tree = ast.parse(open(module.__file__).read())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    loops = [node for node in ast.walk(main) if isinstance(node, ast.For) and ast.unparse(node.target) == "step"]
    assert len(loops) == 1, [loop.lineno for loop in loops]
    return range(loops[0].lineno, loops[0].end_lineno + 1)


def step_loop_syncs(monkeypatch, module, argv) -> list[str]:
    """`module`.main() with `argv` on the fake GPU: the host-device synchronisations (HostSyncs's names) made on the
    lines of its step loop, in the functions it calls there included."""
    lines = step_loop_lines(module)
    with fake_cuda(monkeypatch, watch=module.main.__code__) as syncs:
        run_main(monkeypatch, module, argv)
    return [call for call, line in zip(syncs.calls, syncs.lines, strict=True) if line in lines]


def wrap_envpool_steps(module, monkeypatch, change):
    """Make `module.envpool.make` return pools whose step results pass through `change(obs, reward, terminated,
    truncated, info)`, which returns the five (e.g. a planted NaN or a known reward)."""
    make = module.envpool.make

    class Wrapped:
        def __init__(self, envs):
            self.envs = envs

        def __getattr__(self, name):
            return getattr(self.envs, name)

        def step(self, action):
            return change(*self.envs.step(action))

    monkeypatch.setattr(module.envpool, "make", lambda *args, **kwargs: Wrapped(make(*args, **kwargs)))


def one_reward_per_step(module, monkeypatch):
    """EnvPool pools whose unclipped reward (info["reward"]) is 1 on every real step and 0 on the reset step: each
    game's return is then its length."""

    def change(obs, reward, terminated, truncated, info):
        info["reward"] = (info["elapsed_step"] > 0).astype(np.float64)
        return obs, reward, terminated, truncated, info

    wrap_envpool_steps(module, monkeypatch, change)


def check_life_lost_on_the_time_limit(monkeypatch, tmp_path, module, flags, targets="compute_gae"):
    """EnvPool reports a step that reaches the time limit (here every 5 steps) as truncated, never terminated. Env 0
    loses a life (its lives drop) or its game (info["terminated"]), by turns, on each of its time limits: main() must
    hand `targets` (GAE, Q(lambda)) a termination there; env 1's time limits, where nothing ends, stay truncations."""
    planted = []

    def change(obs, reward, terminated, truncated, info):
        if truncated[0]:
            info |= {name: info[name].copy() for name in ("lives", "terminated")}  # EnvPool's own arrays stay as they are
            planted.append(len(planted) % 2)
            if planted[-1]:
                info["terminated"][0] = 1  # the game over
            else:
                info["lives"][0] -= 1  # a life lost
        return obs, reward, terminated, truncated, info

    fed, compute = [], getattr(module, targets)
    monkeypatch.setattr(module, targets, lambda *args: fed.append(torch.stack(args[2:4])) or compute(*args))
    wrap_envpool_steps(module, monkeypatch, change)
    argv = [*flags, "--max-episode-steps", "5", "--total-timesteps", "64", "--metrics-interval", "0", "--runs-dir"]
    run_main(monkeypatch, module, [*argv, str(tmp_path)])
    terminations, truncations = torch.cat(fed, dim=1).bool()  # (T, N) of every rollout
    assert planted.count(0) >= 2 and planted.count(1) >= 2 and truncations.sum(0).min() >= 2
    assert terminations[:, 0][truncations[:, 0]].all()  # a life or the game lost: no bootstrap
    assert not terminations[:, 1][truncations[:, 1]].any()  # a plain time limit: bootstrap
