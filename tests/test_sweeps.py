"""sweeps/: the launcher (print, local, slurm; skip, resume, failures), every sweep's
commands, and aggregation of a tiny real sweep checked against its event files."""

import functools
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, usage_error
from torch.utils.tensorboard import SummaryWriter

import metrics

LAUNCH = os.path.join(ROOT, "sweeps", "launch.sh")
AGGREGATE = os.path.join(ROOT, "sweeps", "aggregate.py")
GAMES = os.path.join(ROOT, "sweeps", "games.sh")  # the game lists, sourced by the sweeps
SWEEPS = sorted(path for path in glob.glob(os.path.join(ROOT, "sweeps", "*.sh")) if path not in (LAUNCH, GAMES))
KINETIX = os.path.join(ROOT, "sweeps", "kinetix.sh")
NO_KINETIX_SCRIPT = pytest.mark.skipif(
    not os.path.exists(os.path.join(ROOT, "ppo_kinetix.py")),
    reason="ppo_kinetix.py, which kinetix.sh runs, is not written yet",
)
# The sweeps for the tests that parse their commands with the scripts' own Args: kinetix.sh's only once its script exists
SCRIPT_SWEEPS = [
    pytest.param(path, id=os.path.basename(path), marks=[NO_KINETIX_SCRIPT] if path == KINETIX else []) for path in SWEEPS
]


def launch(commands, tmp_path, **env):
    commands_file = tmp_path / "commands.txt"
    commands_file.write_text(commands)
    full_env = {**os.environ, "LOG_DIR": str(tmp_path / "logs"), "JOBS": "1", **env}  # JOBS="": its default (per GPU)
    return subprocess.run(
        ["bash", LAUNCH, str(commands_file)], capture_output=True, text=True, env=full_env, cwd=tmp_path, timeout=120
    )


def test_print_mode_prints_and_runs_nothing(tmp_path):
    result = launch("# a comment\n\ntouch made-a\n  touch made-b --seed 2\n", tmp_path, LAUNCHER="print")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["touch made-a", "  touch made-b --seed 2"]
    assert not (tmp_path / "made-a").exists() and not (tmp_path / "logs").exists()


def test_local_mode_runs_in_parallel_and_reports_failures(tmp_path):
    # the two sleepers overlap only with 2 workers: each waits for the other's file (up to 60 s: a loaded machine)
    commands = (
        "touch first && for i in $(seq 600); do [ -e second ] && exit 0; sleep 0.1; done; exit 1\n"
        "touch second && for i in $(seq 600); do [ -e first ] && exit 0; sleep 0.1; done; exit 1\n"
        "sh -c 'echo broken; exit 3'\n"
    )
    result = launch(commands, tmp_path, JOBS="2")
    assert result.returncode == 1
    assert "[1] done" in result.stdout and "[2] done" in result.stdout
    assert "1 command(s) failed:" in result.stdout
    failed_line = result.stdout.splitlines()[-1]
    assert failed_line.startswith("exit 3 | sh -c 'echo broken; exit 3' | log: ")
    log_path = failed_line.rsplit("log: ", 1)[1]
    assert "broken" in open(tmp_path / log_path if not os.path.isabs(log_path) else log_path).read()


def test_local_jobs_split_the_cores_between_them(tmp_path):
    cores = int(subprocess.run(["getconf", "_NPROCESSORS_ONLN"], capture_output=True, text=True, check=True).stdout)
    environment = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    commands_file = tmp_path / "commands.txt"
    torch_threads = f"{sys.executable} -c 'import torch; print(\"torch\", torch.get_num_threads())'"
    commands_file.write_text(f"echo threads $OMP_NUM_THREADS\necho pqn_atari.py --seed 1\n{torch_threads}\n")
    for jobs, expected in (("1", cores), ("2", max(1, cores // 2)), ("64", max(1, cores // 3))):  # 3 commands: 3 workers
        env = {**environment, "LOG_DIR": str(tmp_path / jobs), "JOBS": jobs}
        subprocess.run(["bash", LAUNCH, str(commands_file)], env=env, cwd=tmp_path, check=True, capture_output=True)
        assert f"threads {expected}" in (tmp_path / jobs / "1.log").read_text()
        assert "pqn_atari.py --seed 1\n" in (tmp_path / jobs / "2.log").read_text()  # no --torch-threads: on a GPU it takes 1
        assert f"torch {expected}\n" in (tmp_path / jobs / "3.log").read_text()  # torch follows OMP_NUM_THREADS
    env = {**environment, "LOG_DIR": str(tmp_path / "set"), "JOBS": "2", "OMP_NUM_THREADS": "7"}  # the user's choice wins
    subprocess.run(["bash", LAUNCH, str(commands_file)], env=env, cwd=tmp_path, check=True, capture_output=True)
    assert "threads 7" in (tmp_path / "set" / "1.log").read_text()


FAKE_RUN = """import signal, sys, time
open(f"started_{sys.argv[1]}", "w").close()
def stop(signum, frame):  # as the training scripts do: save, then exit 128 + the signal
    open(f"saved_{sys.argv[1]}", "w").close()
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_ctrl_c_or_sigterm_stops_the_sweep_once_the_runs_in_flight_have_saved(tmp_path, signum, to_group):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to the launcher alone: the runs in flight get it and
    save, nothing more starts, and the launcher says so and exits with the signal's status."""
    (tmp_path / "fake_run.py").write_text(FAKE_RUN)
    (tmp_path / "commands.txt").write_text("".join(f"{sys.executable} fake_run.py {i}\n" for i in range(1, 5)))
    env = {**os.environ, "LOG_DIR": str(tmp_path / "logs"), "JOBS": "2"}
    # bash cannot trap a signal ignored when it started, as SIGINT is in whatever a script started with `cmd &` (make
    # test so started failed here): the launcher starts as from a terminal, SIGINT at its default
    from_a_terminal = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp('bash', sys.argv[1:])"
    command = [sys.executable, "-c", from_a_terminal, "bash", LAUNCH, "commands.txt"]
    with subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    ) as launcher:
        for _ in range(600):
            if (tmp_path / "started_1").exists() and (tmp_path / "started_2").exists():
                break
            time.sleep(0.1)
        time.sleep(0.5)  # their handlers are set
        (os.killpg if to_group else os.kill)(launcher.pid, signum)
        output = launcher.communicate(timeout=60)[0]
    assert launcher.returncode == 128 + signum, output
    assert output.count(f"FAILED (exit {128 + signum}: interrupted, a re-run resumes it)") == 2, output
    assert f"stopped by {signum.name}: 2 command(s) not started" in output
    assert sorted(path.name for path in tmp_path.glob("s*_*")) == ["saved_1", "saved_2", "started_1", "started_2"]


def test_a_lock_check_that_cannot_run_holds_nothing_and_a_failure_is_one_line(tmp_path):
    """Without a python3 that runs, a run's lock counts as free (a run that died before its first checkpoint is not
    skipped as being trained for ever); an args.json that cannot be read is one failure, on one line."""
    make_run(tmp_path / "runs", "Pong-v5__died__1__100", ["lock"])
    broken = make_run(tmp_path / "runs", "Pong-v5__broken__1__100", ["done.json"])
    (broken / "args.json").write_text("{not json")
    commands = "".join(f"echo x.py --env-id Pong-v5 --exp-name {name}\n" for name in ("died", "broken"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text("#!/bin/sh\nexit 127\n")
    (tmp_path / "bin" / "python3").chmod(0o755)
    result = launch(commands, tmp_path, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert result.returncode == 1 and "[1] start: echo x.py --env-id Pong-v5 --exp-name died" in result.stdout
    result = launch(commands, tmp_path)
    assert "1 command(s) failed:" in result.stdout and result.stdout.rstrip().endswith(
        "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    ), result.stdout


def make_run(runs_dir, name, files):
    run_dir = runs_dir / name
    run_dir.mkdir(parents=True)
    for file in files:
        (run_dir / file).write_text("{}")
    return run_dir


def test_local_mode_skips_finished_runs_and_resumes_interrupted_ones(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "Pong-v5__finished__1__100", ["args.json", "checkpoint.pt", "done.json"])
    make_run(runs, "Pong-v5__interrupted__2__100", ["args.json", "checkpoint.pt"])
    interrupted = make_run(runs, "Pong-v5__interrupted__2__200", ["args.json", "checkpoint.pt"])  # the newer: resumed
    make_run(runs, "Pong-v5__crashed__1__100", ["args.json"])  # no checkpoint: starts over
    commands = "\n".join(
        f"echo --env-id Pong-v5 --exp-name {name} --seed {seed} --runs-dir runs"
        for name, seed in [("finished", 1), ("interrupted", 2), ("crashed", 1), ("new", 1)]
    )
    result = launch(commands + "\n", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[1] skipped (finished)" in result.stdout
    assert "launched 3 (1 resumed from a checkpoint), skipped 1 finished" in result.stdout
    logs = {int(os.path.basename(path)[:-4]): open(path).read() for path in glob.glob(str(tmp_path / "logs" / "*.log"))}
    assert sorted(logs) == [2, 3, 4]
    assert logs[2].splitlines()[-1].endswith(f"--resume runs/{interrupted.name}/checkpoint.pt")
    assert "--resume" not in logs[3] and "--resume" not in logs[4]


def test_runs_trained_with_other_flags_are_neither_skipped_nor_resumed(tmp_path):
    """Flags are compared with the run's args.json: numbers as numbers, --flag/--no-flag, lists; --torch-threads, a
    value "auto" and flags that args.json lacks are not compared."""
    runs = tmp_path / "runs"
    recorded = {"total_timesteps": 2048, "learning_rate": 2.5e-4, "bf16": False, "clip_coef_bounds": [0.01, 0.5]}
    recorded |= {"backend": "envpool", "torch_threads": 1}
    for name, files in (("finished", ["done.json"]), ("interrupted", ["checkpoint.pt"])):
        (make_run(runs, f"Pong-v5__{name}__1__100", files) / "args.json").write_text(json.dumps(recorded))
    same = "--total-timesteps 2048 --learning-rate 2.5e-4 --no-bf16 --clip-coef-bounds 0.01 0.5 --backend auto"  # 0.00025
    commands = [
        f"echo x.py --env-id Pong-v5 --exp-name finished {same} --torch-threads 2 --new-flag 3",
        f"echo x.py --env-id Pong-v5 --exp-name interrupted {same}",
        "echo x.py --env-id Pong-v5 --exp-name finished --total-timesteps=4096 --bf16",
        "echo x.py --env-id Pong-v5 --exp-name interrupted --clip-coef-bounds 0.02 0.5",
        "echo x.py --env-id Pong-v5 --exp-name interrupted --clip-coef-bounds 0.01",  # a list of another length
    ]
    result = launch("\n".join(commands) + "\n", tmp_path)
    assert result.returncode == 1
    assert "[1] skipped (finished)" in result.stdout and "launched 1 (1 resumed from a checkpoint)" in result.stdout
    conflicts = [line for line in result.stdout.splitlines() if line.startswith("not run | ")]
    assert len(conflicts) == 3
    assert "(--total-timesteps 2048 there / 4096 here; --bf16 False there / True here)" in conflicts[0]
    assert "(--clip-coef-bounds 0.01 0.5 there / 0.02 0.5 here)" in conflicts[1]
    assert "(--clip-coef-bounds 0.01 0.5 there / 0.01 here)" in conflicts[2]


def test_a_minibatch_size_or_count_left_out_compares_as_the_split_it_means(tmp_path):
    """Some scripts record the minibatch size they derive from --num-minibatches (and the count they derive from a
    --minibatch-size), others leave a size that was not given at None: a flag a command leaves out matches the
    recorded value when both make the same split, and only then."""
    script = os.path.join(ROOT, "ppo_atari_envpool.py")  # its Args' defaults: --num-minibatches 4, no --minibatch-size
    cases = {  # run name: (recorded minibatch_size, num_minibatches), the command's extra flags, skipped?
        "atari_default": ((None, 4), "", True),
        "derived_size": ((32, 4), "", True),
        "given_size": ((64, 4), "", False),  # an Atari run of --minibatch-size 64: not the 4 minibatches of 32 asked
        "derived_count": ((64, 2), "", False),
        "given_size_again": ((64, 2), "--minibatch-size 64", True),
    }
    commands = []
    for name, ((size, count), extra, _) in cases.items():
        recorded = {"script": "ppo_atari_envpool.py", "num_envs": 4, "num_steps": 32, "batch_size": 128}
        recorded |= {"minibatch_size": size, "num_minibatches": count}
        (make_run(tmp_path / "runs", f"Pong-v5__{name}__1__100", ["done.json"]) / "args.json").write_text(json.dumps(recorded))
        commands.append(f"true {script} --env-id Pong-v5 --exp-name {name} --num-envs 4 --num-steps 32 {extra}")
    result = launch("\n".join(commands) + "\n", tmp_path)
    for index, (name, (_, _, skipped)) in enumerate(cases.items(), start=1):
        assert (f"[{index}] skipped (finished)" in result.stdout) == skipped, (name, result.stdout)


def test_a_variants_run_is_told_apart_from_the_run_of_the_script_it_copies(tmp_path):
    """A copied script (a variant) under the same run name: args.json's "script" differs; a default computed from
    more than numbers cannot be compared and must be given; the run name's exp_name defaults to the script's name."""
    args_class = "class Args:\n    exp_name: str = os.path.basename(__file__)\n    kl_coef: float = 0.1 * 2\n"
    (tmp_path / "ppo_variant.py").write_text(args_class + '    device: str = os.environ.get("DEVICE", "cpu")\n')
    recorded = {"script": "ppo_atari_envpool.py", "exp_name": "ppo_variant", "kl_coef": 0.2, "device": "cpu"}
    run_dir = make_run(tmp_path / "runs", "Pong-v5__ppo_variant__1__100", ["done.json"])
    (run_dir / "args.json").write_text(json.dumps(recorded))
    result = launch("echo ppo_variant.py --env-id Pong-v5\n", tmp_path)  # no --exp-name: the script's name
    assert result.returncode == 1, result.stdout
    differences = "(ppo_atari_envpool.py there / ppo_variant.py here; --device cpu there / ? here (a computed default: give"
    assert differences in result.stdout
    (run_dir / "args.json").write_text(json.dumps(recorded | {"script": "ppo_variant.py"}))
    assert "[1] skipped (finished)" in launch("echo ppo_variant.py --env-id Pong-v5 --device cpu\n", tmp_path).stdout
    changed = launch("echo ppo_variant.py --env-id Pong-v5 --device cpu --kl-coef 0.3\n", tmp_path)
    assert "(--kl-coef 0.2 there / 0.3 here)" in changed.stdout  # 0.1 * 2 was read as 0.2: not a difference above


def test_local_workers_get_gpus_of_their_own(tmp_path, monkeypatch):
    """On a box of several GPUs, JOBS workers do not all train on GPU 0: each worker slot gets its own GPU (NPROC of
    them), those of CUDA_VISIBLE_DEVICES when it is set (empty: none), else nvidia-smi's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n'\n")  # a box of 3 GPUs
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    commands = "".join(f'echo "$CUDA_VISIBLE_DEVICES" > gpu{i}; sleep 0.{i}\n' for i in range(1, 6))

    def gpus(**env):
        result = launch(commands, tmp_path, JOBS="2", **env)
        assert result.returncode == 0, result.stdout + result.stderr
        return [(tmp_path / f"gpu{i}").read_text().strip() for i in range(1, 6)]

    assigned = gpus()
    assert sorted(assigned[:2]) == ["0", "1"] and set(assigned) == {"0", "1"}  # two workers, two GPUs, taken in turn
    by_default = launch(commands, tmp_path, JOBS="")  # JOBS left out: a worker per GPU, not 2 of the 3 GPUs idle
    assert by_default.stdout.startswith("JOBS=3: a worker per 1 of the 3 GPUs"), by_default.stdout
    assert sorted((tmp_path / f"gpu{i}").read_text().strip() for i in range(1, 4)) == ["0", "1", "2"]
    assert "JOBS=" not in launch(commands, tmp_path, JOBS="", NPROC="2").stdout  # 3 GPUs: 1 worker of 2 (JOBS=1)
    two = launch(commands, tmp_path, JOBS="", CUDA_VISIBLE_DEVICES="0,1")  # exactly 2 x NPROC GPUs: 2 workers
    assert two.stdout.startswith("JOBS=2: a worker per 1 of the 2 GPUs"), two.stdout
    assert set(gpus(CUDA_VISIBLE_DEVICES="5, 7")) == {"5", "7"}
    assert set(gpus(CUDA_VISIBLE_DEVICES="5,,7")) == {"5", "7"}  # an empty entry is no GPU
    assert set(gpus(CUDA_VISIBLE_DEVICES="")) == {""}  # hidden: every GPU stays hidden
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n")
    assert set(gpus()) == {""}  # no GPU listed: none assigned


def launch_with_fake_sbatch(commands, tmp_path, squeue="", **env):
    """launch() with LAUNCHER=slurm, an `sbatch` that records its arguments (one a line) in sbatch.log, and an `squeue`
    whose shell code is `squeue` (default: none queued)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_sbatch, fake_squeue = bin_dir / "sbatch", bin_dir / "squeue"
    fake_sbatch.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> "$SBATCH_LOG"\necho 4242\n')
    fake_squeue.write_text(f"#!/bin/sh\n{squeue}\n")
    fake_sbatch.chmod(0o755), fake_squeue.chmod(0o755)
    return launch(
        commands,
        tmp_path,
        LAUNCHER="slurm",
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SBATCH_LOG=str(tmp_path / "sbatch.log"),
        **env,
    )


def job_commands(tmp_path):
    """The command of each job submitted so far (sbatch.log): its --wrap is LAUNCHER=exec of a file with the command."""
    wraps = [arg for arg in (tmp_path / "sbatch.log").read_text().splitlines() if arg.startswith("--wrap=")]
    return [open(shlex.split(wrap)[-1]).read().strip() for wrap in wraps]


def test_slurm_mode_submits_each_command_with_sbatch(tmp_path):
    result = launch_with_fake_sbatch("echo one --seed 1\necho two\n", tmp_path, SBATCH_ARGS="--gres=gpu:1 --time=1:00:00")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[1] submitted job 4242: echo one --seed 1" in result.stdout
    submitted = (tmp_path / "sbatch.log").read_text().splitlines()
    assert submitted.count("--gres=gpu:1") == 2 and submitted.count("--time=1:00:00") == 2
    assert job_commands(tmp_path) == ["echo one --seed 1", "echo two"]


def test_a_slurm_job_decides_at_each_start_whether_to_resume(tmp_path):
    """Slurm requeues a pre-empted job with the command it was submitted with: the job itself (LAUNCHER=exec) looks
    at its run each time it starts: new, resumed from the checkpoint of its first start, finished, or trained by
    another process. Locally such a run is skipped too."""
    command = "echo x.py --env-id Pong-v5 --exp-name ppo"
    logs = tmp_path / "it's a lög"  # quoted for /bin/sh, whatever the locale
    assert launch_with_fake_sbatch(command + "\n", tmp_path, LOG_DIR=str(logs), LC_ALL="C").returncode == 0
    (wrap,) = [arg[len("--wrap=") :] for arg in (tmp_path / "sbatch.log").read_text().splitlines() if "--wrap=" in arg]
    environment = {**os.environ, "NPROC": "4"}  # the job's environment is the submitter's: not wrapped again

    def start_job():
        return subprocess.run(["sh", "-c", wrap], capture_output=True, text=True, cwd=tmp_path, env=environment)

    assert start_job().stdout.splitlines()[-1] == "x.py --env-id Pong-v5 --exp-name ppo"
    run_dir = make_run(tmp_path / "runs", "Pong-v5__ppo__1__100", ["checkpoint.pt"])  # pre-empted; requeued:
    (run_dir / "args.json").write_text(json.dumps({"script": "x.py", "env_id": "Pong-v5", "exp_name": "ppo"}))
    assert (
        start_job().stdout.splitlines()[-1]
        == f"x.py --env-id Pong-v5 --exp-name ppo --resume runs/{run_dir.name}/checkpoint.pt"
    )
    hold = "import fcntl, sys; lock = open('lock', 'w'); fcntl.lockf(lock, fcntl.LOCK_EX); print(flush=True); sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", hold], cwd=run_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as holder:
        holder.stdout.readline()  # the lock is held
        job = start_job()
        assert job.returncode == 1 and job.stderr == f"NOT RUN: runs/{run_dir.name} is being trained by another process\n"
        local = launch(command + "\n", tmp_path)
        assert local.returncode == 0 and f"[1] skipped (being trained by another process: runs/{run_dir.name})" in local.stdout
        holder.stdin.close()
    assert launch(command + "\n", tmp_path).stdout.startswith("[1] start: ")  # the lock is free: resumed
    dead = make_run(tmp_path / "runs", "Pong-v5__ppo__1__50", ["lock"])  # died before a checkpoint, of other flags
    (dead / "args.json").write_text(json.dumps({"script": "x.py", "env_id": "Pong-v5", "exp_name": "ppo", "seed": 9}))
    assert launch(command + "\n", tmp_path).returncode == 0  # nothing to resume there: not a conflict
    unwritable = launch(command + "\n", tmp_path, LOG_DIR="/dev/null/logs")
    assert unwritable.returncode == 2 and unwritable.stderr.endswith("error: LOG_DIR '/dev/null/logs' cannot be created\n")
    (run_dir / "done.json").touch()
    assert start_job().stdout == f"skipped (finished): {command}\n"


def test_slurm_rerun_submits_no_command_whose_job_still_waits(tmp_path):
    """A sweep re-run while its jobs are queued or running (no run directory, or one without done.json) skips them:
    submitted again, a job would repeat a run, or write into the same run directory as the running one."""
    still_queued = "sed -n 's/^--job-name=//p' \"$SBATCH_LOG\" 2>/dev/null"  # every job submitted so far still waits
    commands = "echo one --seed 1\necho two --seed 1\n"
    first = launch_with_fake_sbatch("echo one --seed 1\n", tmp_path, squeue=still_queued)
    assert first.returncode == 0 and "submitted job 4242" in first.stdout, first.stdout + first.stderr
    second = launch_with_fake_sbatch(commands, tmp_path, squeue=still_queued)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "[1] skipped (queued or running as Slurm job sweep-" in second.stdout and "[2] submitted job 4242" in second.stdout
    assert "launched 1 (0 resumed from a checkpoint), skipped 0 finished and 1 queued or running" in second.stdout
    assert job_commands(tmp_path) == ["echo one --seed 1", "echo two --seed 1"]
    # squeue failing (not on this node, controller down): a warning, and the commands are submitted
    failed = launch_with_fake_sbatch(commands, tmp_path, squeue="echo 'slurm_load_jobs error' >&2; exit 1")
    assert failed.returncode == 0 and failed.stdout.count("submitted job 4242") == 2, failed.stdout
    assert "warning: squeue failed (slurm_load_jobs error)" in failed.stderr


def test_nproc_runs_each_command_as_one_torchrun_run(tmp_path):
    # one write() per process: two processes' print()s into one log can interleave
    (tmp_path / "show_rank.py").write_text(
        'import os\nos.write(1, f\'rank {os.environ["RANK"]} of {os.environ["WORLD_SIZE"]}\\n\'.encode())\n'
    )
    command = f"{sys.executable} show_rank.py --seed 1\n"
    printed = launch(command, tmp_path, LAUNCHER="print", NPROC="2").stdout.splitlines()
    assert printed == [f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node=2 show_rank.py --seed 1"]
    result = launch(command, tmp_path, NPROC="2")
    assert result.returncode == 0, result.stdout + result.stderr
    log = (tmp_path / "logs" / "1.log").read_text()
    assert "rank 0 of 2" in log and "rank 1 of 2" in log


def test_nproc_under_slurm_starts_torchrun_on_every_node(tmp_path):
    result = launch_with_fake_sbatch("python train.py --seed 1\n", tmp_path, NPROC="4", SBATCH_ARGS="--nodes=2 --gres=gpu:4")
    assert result.returncode == 0, result.stdout + result.stderr
    submitted = (tmp_path / "sbatch.log").read_text().splitlines()
    assert "--nodes=2" in submitted and "--ntasks-per-node=1" in submitted
    (job,) = job_commands(tmp_path)
    assert job.startswith("srun --ntasks-per-node=1 python -m torch.distributed.run --nnodes=$SLURM_NNODES")
    assert "--nproc-per-node=4" in job and "--rdzv-id=$SLURM_JOB_ID" in job and job.endswith(" train.py --seed 1")
    assert ":$((29500 + SLURM_JOB_ID % 10000)) " in job  # two jobs that share a first node meet on ports of their own


@pytest.mark.parametrize(
    "env, fragment",
    [({"LAUNCHER": "cloud"}, "LAUNCHER must be"), ({"JOBS": "0"}, "JOBS must be"), ({"NPROC": "two"}, "NPROC must be")],
)
def test_launcher_rejects_bad_settings(tmp_path, env, fragment):
    result = launch("true\n", tmp_path, **env)
    assert result.returncode == 2 and fragment in result.stderr and len(result.stderr.splitlines()) == 1


def sweep_commands(sweep, tmp_path, scale):
    """The commands that `sweep` prints at that SCALE, with tmp_path/runs as RUNS_DIR."""
    return [command.replace(RUNS_DIR_TOKEN, str(tmp_path / "runs")) for command in printed_commands(sweep, scale)]


RUNS_DIR_TOKEN = "/sweep-test-runs-dir"


@functools.cache  # several tests read each sweep's commands; at paper scale outer_step.sh takes 3 s to print its 2,050
def printed_commands(sweep, scale):
    env = {**os.environ, "LAUNCHER": "print", "SCALE": scale, "RUNS_DIR": RUNS_DIR_TOKEN}
    result = subprocess.run(["bash", sweep], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(result.stdout.splitlines())


def parse_command(words, monkeypatch):
    """The script's Args for a printed command (its words after the python), as the script parses them. A checkpoint that
    an --init-from names and that a sweep's earlier stage would have written (sweeps/restart.sh) is made first: a file of
    the script's own flags, which is all that the scripts check before they make their envs."""
    import dataclasses
    import importlib

    script = os.path.basename(words[0])
    module = importlib.import_module(script.removesuffix(".py"))
    if "--init-from" in words and not os.path.exists(path := words[words.index("--init-from") + 1]):
        base = [word for word in words[1:] if word not in (path, "--init-from", "--init-optimizer")]
        monkeypatch.setattr(sys, "argv", [script, *base])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        args = dataclasses.asdict(module.parse_args()[0])
        torch.save({"args": args, "iteration": 1, "global_step": args["batch_size"]}, path)
    monkeypatch.setattr(sys, "argv", [script, *words[1:]])
    return module.parse_args()[0]


@pytest.mark.parametrize("sweep", SCRIPT_SWEEPS)
def test_every_sweep_prints_commands_the_scripts_accept(sweep, tmp_path, monkeypatch, capsys):
    """Each distinct configuration of the CPU and the paper-scale version passes the
    script's own flag validation (a typo in a sweep would fail here, not on a cluster), and launch.sh finds the run
    that the command trains (its directory, the args.json the script writes) the run of that command: it skips it."""
    import dataclasses

    for scale in ("cpu", "paper"):
        commands = sweep_commands(sweep, tmp_path, scale)
        assert commands, f"{sweep} printed no command"
        names, finished = set(), []
        for command in commands:
            words = shlex.split(command)
            exp_name = words[words.index("--exp-name") + 1]
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+", exp_name), exp_name  # the run name encodes the configuration
            if (exp_name, scale) in names:
                continue
            names.add((exp_name, scale))
            script = os.path.basename(words[1])
            args = parse_command(words[1:], monkeypatch)
            run_dir = make_run(tmp_path / "runs", f"{args.env_id}__{args.exp_name}__{args.seed}__100", ["done.json"])
            (run_dir / "args.json").write_text(json.dumps({"script": script, **dataclasses.asdict(args)}))
            finished.append(shlex.join(["true", os.path.join(ROOT, script), *words[2:]]))  # its Args' defaults count
        assert capsys.readouterr().err == ""
        result = launch("\n".join(finished) + "\n", tmp_path)
        assert result.returncode == 0 and result.stdout.count("skipped (finished)") == len(finished), result.stdout
        shutil.rmtree(tmp_path / "runs")
    paper = " ".join(sweep_commands(sweep, tmp_path, "paper"))
    assert "--seed 5" in paper and "--seed 6" not in paper  # the paper's five seeds of every setup (its Appendix A)


def test_results_table_gives_each_sweeps_paper_scale_run_count(tmp_path):
    """docs/figures.md's table of the sweeps at paper scale counts the commands each sweep prints, one row a sweep."""
    table = open(os.path.join(ROOT, "docs", "figures.md")).read().split("## The sweeps at paper scale")[1]
    rows = re.findall(r"`bash sweeps/(\w+)\.sh`.*= ([\d,]+) runs", table)
    assert sorted(name for name, _ in rows) == sorted(os.path.basename(path)[:-3] for path in SWEEPS)
    for name, count in rows:
        assert len(sweep_commands(os.path.join(ROOT, "sweeps", f"{name}.sh"), tmp_path, "paper")) == int(
            count.replace(",", "")
        ), name


def final_scores_from_events(run_dir):
    """Directly from the event file: mean human-normalised return of the episodes ending in
    the second half of the run's steps (the report is made with --final-fraction 0.5)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = json.load(open(os.path.join(run_dir, "args.json")))
    total = args["num_iterations"] * args["batch_size"]
    values = []
    for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        accumulator = EventAccumulator(path, size_guidance={"scalars": 0})
        accumulator.Reload()
        values += [e.value for e in accumulator.Scalars("charts/episodic_return") if e.step > 0.5 * total]
    return float(np.mean(metrics.human_normalized_score(args["env_id"], np.array(values))))


def test_tiny_sweep_end_to_end_then_rerun_skips_and_resumes(tmp_path, monkeypatch):
    from scipy.stats import trim_mean

    from sweeps import aggregate

    runs = tmp_path / "runs"
    env = {
        **os.environ,
        "GAMES": "Breakout",
        "SEEDS": "1 2",
        "TOTAL_TIMESTEPS": "512",
        "SHAPES": "4x16 8x8",
        "RUNS_DIR": str(runs),
        "LOG_DIR": str(tmp_path / "logs"),
        "JOBS": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "EXTRA_FLAGS": "--no-cuda --max-episode-steps 40 --metrics-interval 2 --metrics-batch 24",
    }
    sweep = os.path.join(ROOT, "sweeps", "fixed_budget.sh")
    result = subprocess.run(["bash", sweep], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dirs = sorted(glob.glob(str(runs / "Breakout-v5__*")))
    assert len(run_dirs) == 4 and all(os.path.exists(os.path.join(d, "done.json")) for d in run_dirs)

    baseline = ["--baseline", "ppo_envs4_steps16"]  # the report in-process: its command line is the other tests'
    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    report = ["report", str(runs), "--reps", "200", "--pdf", "--final-fraction", "0.5", *baseline]
    monkeypatch.setattr(sys, "argv", [AGGREGATE, *report])
    aggregate.main()
    out = runs / "report"
    figures = ("learning_curves", "iqm_curves", "aggregate_metrics", "performance_profiles", "metric_curves", "ddr_vs_score")
    for name in (*figures, "score_vs_num_envs", "probability_of_improvement"):
        assert (out / f"{name}.png").stat().st_size > 10_000 and (out / f"{name}.pdf").exists(), name
    rows, aggregates = {}, {}
    for line in (out / "report.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith("ppo_envs") and len(cells) in (9, 5):
            (rows if len(cells) == 9 else aggregates)[cells[0]] = cells
    assert sorted(rows) == ["ppo_envs4_steps16", "ppo_envs8_steps8"]
    expected_shape = {"ppo_envs4_steps16": ["4", "16"], "ppo_envs8_steps8": ["8", "8"]}
    for config, cells in rows.items():
        scores = [final_scores_from_events(d) for d in run_dirs if f"__{config}__" in d]
        assert len(scores) == 2 and not np.isnan(scores).any()
        assert cells[1:6] == [*expected_shape[config], "64", "4", "2"]  # N_envs, N_RO, batch, epochs, seeds
        assert float(cells[6].split()[0]) == pytest.approx(trim_mean(scores, 0.25), abs=1e-3)  # the IQM
        assert float(cells[7]) == pytest.approx(np.mean(scores), abs=1e-3)
        # rliable's table, one game: median and mean over games are the seeds' mean; the gap is 1 - mean(min(score, 1))
        median, iqm, mean, gap = (float(cell.split()[0]) for cell in aggregates[config][1:])
        assert median == mean == pytest.approx(np.mean(scores), abs=1e-3) and iqm == float(cells[6].split()[0])
        assert gap == pytest.approx(1 - np.mean(np.minimum(scores, 1)), abs=1e-3)
        assert aggregates[config][2].split(maxsplit=1)[1] == cells[6].split(maxsplit=1)[1]  # the same IQM CI
    # --baseline: of the 2 x 2 pairs of seeds (one game), the share where the 8-env run scores higher, a tie counting half
    scores = {c: [final_scores_from_events(d) for d in run_dirs if f"__{c}__" in d] for c in ("ppo_envs8_steps8", baseline[1])}
    other, base = scores.values()
    wins = sum((a > b) + 0.5 * (a == b) for a in other for b in base)
    table = (out / "report.md").read_text().split("| configuration | P(X > ppo_envs4_steps16) [95 % CI] |\n|---|---|\n")[1]
    (row,) = table.split("\n\n")[0].splitlines()
    assert row.startswith("| ppo_envs8_steps8 | ") and float(row.split("|")[2].split()[0]) == wins / 4

    # Re-run: finished runs are skipped; a run whose marker is gone resumes from its checkpoint.
    os.remove(os.path.join(run_dirs[0], "done.json"))
    again = subprocess.run(["bash", sweep], capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "launched 1 (1 resumed from a checkpoint), skipped 3 finished" in again.stdout
    assert sorted(glob.glob(str(runs / "Breakout-v5__*"))) == run_dirs  # no new run directory
    assert json.load(open(os.path.join(run_dirs[0], "done.json")))["global_step"] == 512

    # Another budget under the same names: no run is skipped or resumed as if it were this command's.
    other = subprocess.run(["bash", sweep], capture_output=True, text=True, env={**env, "TOTAL_TIMESTEPS": "1024"})
    assert other.returncode == 1 and other.stdout.count("NOT RUN") == 4, other.stdout + other.stderr
    assert "(--total-timesteps 512 there / 1024 here)" in other.stdout
    # A flag left out now means the script's default (read from its Args), not the value the runs were trained with
    default = {**env, "EXTRA_FLAGS": env["EXTRA_FLAGS"].replace(" --metrics-batch 24", "")}
    other = subprocess.run(["bash", sweep], capture_output=True, text=True, env=default)
    not_run = [line for line in other.stdout.splitlines() if "NOT RUN" in line]
    assert other.returncode == 1 and len(not_run) == 4, other.stdout
    assert all(line.endswith("(--metrics-batch 24 there / 2048 here): give this sweep another RUNS_DIR") for line in not_run)
    assert sorted(glob.glob(str(runs / "Breakout-v5__*"))) == run_dirs


def test_iqm_is_the_mean_of_the_middle_half_and_its_bootstrap_ci_brackets_it():
    from sweeps.aggregate import interval_estimates, iqm

    # 8 runs x 2 games: sorted 0 1 1 2 | 2 3 3 4 4 5 5 6 | 6 7 7 900, the middle half's mean is 4 (the mean is 60.4)
    scores = np.array([[0, 900], [1, 2], [1, 3], [2, 4], [3, 5], [4, 6], [5, 7], [6, 7]], dtype=float)
    assert iqm(scores) == pytest.approx(4.0)
    estimates, intervals = interval_estimates({"a": scores}, lambda x: np.array([iqm(x)]), reps=200)
    (low,), (high,) = intervals["a"]
    assert estimates["a"][0] == pytest.approx(4.0) and low < 4.0 < high < 60  # the outlier moves neither
    again = interval_estimates({"a": scores}, lambda x: np.array([iqm(x)]), reps=200)[1]["a"]
    assert np.array_equal(intervals["a"], again)  # seeded: a report can be regenerated exactly


def test_rliable_aggregates_by_hand_and_the_iqm_ci_is_the_one_of_the_iqm_alone():
    from sweeps.aggregate import aggregate_metrics, interval_estimates, iqm, score_distribution

    # 4 runs x 3 games; game means 0.5, 1.5, 0.2: median 0.5, mean 2.2 / 3. Sorted, the 12 scores are
    # 0 .1 .2 | .2 .4 .5 .6 .8 1 | 1 2 2: IQM 3.5 / 6. Clipped at 1 they sum to 2 + 4 + 0.8: the gap is 1 - 6.8 / 12.
    scores = np.array([[0.2, 1.0, 0.0], [0.4, 2.0, 0.1], [0.6, 1.0, 0.2], [0.8, 2.0, 0.5]])
    expected = [0.5, 3.5 / 6, 2.2 / 3, 1 - 6.8 / 12]
    assert aggregate_metrics(scores, normalised=True) == pytest.approx(expected)
    assert aggregate_metrics(scores, normalised=False) == pytest.approx(expected[:3])  # raw returns: no level to fall short of
    estimates, intervals = interval_estimates({"a": scores}, lambda x: aggregate_metrics(x, True), reps=200)
    assert estimates["a"] == pytest.approx(expected) and (intervals["a"][0] <= estimates["a"]).all()
    assert (estimates["a"] <= intervals["a"][1]).all() and (intervals["a"][0] < intervals["a"][1]).all()
    alone = interval_estimates({"a": scores}, lambda x: np.array([iqm(x)]), reps=200)[1]["a"]
    assert np.array_equal(intervals["a"][:, 1:2], alone)  # the same resamples: the main table's IQM CI is unchanged
    # the performance profile: of the 12 scores, 12 are above -1, 11 above 0, 6 above 0.5, 2 above 1 (the 2s), none above 2
    assert score_distribution(scores, np.array([-1, 0, 0.5, 1, 2])).tolist() == [1, 11 / 12, 6 / 12, 2 / 12, 0]


def test_probability_of_improvement_by_hand_and_its_ci():
    from sweeps.aggregate import interval_estimates, probability_of_improvement

    # 2 runs of X against 3 of Y on 2 games. Game 1: 3 beats 1 and 2, 4 beats 1 and 2, neither beats 5: 4 of 6 pairs.
    # Game 2: 1 beats no 2, 2 ties each 2 (half a win each): 1.5 of 6. P(X > Y) = (4/6 + 1.5/6) / 2; P(Y > X) the rest.
    x, y = np.array([[3.0, 1.0], [4.0, 2.0]]), np.array([[1.0, 2.0], [2.0, 2.0], [5.0, 2.0]])
    assert probability_of_improvement(x, y) == pytest.approx(5.5 / 12)
    assert probability_of_improvement(y, x) == pytest.approx(6.5 / 12)
    assert probability_of_improvement(x, x) == 0.5
    from rliable import metrics as rliable_metrics  # the reference: scipy's Mann-Whitney U per game

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 4, (5, 3)).astype(float), rng.integers(0, 4, (4, 3)).astype(float)  # ties in every game
    assert probability_of_improvement(x, y) == pytest.approx(rliable_metrics.probability_of_improvement(x, y))
    estimates, intervals = interval_estimates({"x": (x, y)}, probability_of_improvement, reps=200)
    (low, high), again = intervals["x"], interval_estimates({"x": (x, y)}, probability_of_improvement, reps=200)[1]["x"]
    expected = probability_of_improvement(x, y)
    assert estimates["x"] == expected and 0 <= low < expected < high <= 1 and np.array_equal(again, (low, high))


def test_a_curve_ci_counts_the_runs_at_each_point_and_a_configurations_ci_ignores_the_others():
    """Past the end of a shorter run, the interval is over the runs left (it was over all, too narrow), none for one;
    a configuration's bootstrap CI is the same whichever configurations come before it (each from the same seed); the
    N_envs plot joins points into the fewer lines."""
    from scipy.stats import t as student

    from sweeps import aggregate

    mean, half = aggregate.mean_and_ci(np.array([[1.0, 1.0, 1.0], [3.0, 3.0, np.nan], [5.0, np.nan, np.nan]]))
    assert mean.tolist() == [3.0, 2.0, 1.0] and half[2] == 0.0
    assert half[0] == pytest.approx(student.ppf(0.975, 2) * 2 / np.sqrt(3))
    assert half[1] == pytest.approx(student.ppf(0.975, 1) * np.sqrt(2) / np.sqrt(2))
    rng = np.random.default_rng(0)
    scores, other = rng.normal(5, 2, (5, 2)), rng.normal(0, 1, (7, 2))
    iqm = lambda x: np.array([aggregate.iqm(x)])  # noqa: E731
    alone = aggregate.interval_estimates({"b": scores}, iqm, reps=200)[1]["b"]
    assert np.array_equal(aggregate.interval_estimates({"a": other, "b": scores}, iqm, reps=200)[1]["b"], alone)
    rows = [{"config": f"ppo_envs{e}_steps{1024 // e}", "num_steps": 1024 // e, "batch_size": 1024} for e in (8, 16, 32)]
    rows.append({"config": "ppo_envs16_steps128", "num_steps": 128, "batch_size": 2048})
    series = aggregate.score_series([row | {"schedule": None} for row in rows])
    assert {name: len(line) for name, line in series.items()} == {"ppo, batch = 1024": 3, "ppo, batch = 2048": 1}


def test_joint_coverage_counts_cells_on_a_shared_grid():
    from sweeps.aggregate import joint_coverage

    # corners fix the unit square; on a 4 x 4 grid run "a" occupies 2 cells, run "b" 3
    points = {
        "a": np.array([[0.0, 0.0], [4.0, 4.0], [0.1, 0.1]]),
        "b": np.array([[1.5, 1.5], [2.5, 0.5], [2.6, 0.6], [3.9, 0.1]]),
    }
    assert joint_coverage(points, grid=4) == {"a": 2 / 16, "b": 3 / 16}


def test_coverage_of_synthetic_embeddings(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 20, size=(8, 16))
    embeddings = {
        "narrow": rng.normal(0, 0.3, size=(200, 16)),  # one cluster
        "wide": centres[rng.integers(0, 8, 200)] + rng.normal(0, 0.3, size=(200, 16)),
    }  # eight
    for name, features in embeddings.items():
        run_dir = tmp_path / f"Breakout-v5__{name}__1__100"
        run_dir.mkdir()
        json.dump(
            {"env_id": "Breakout-v5", "exp_name": name, "seed": 1, "num_iterations": 1, "batch_size": 1},
            open(run_dir / "args.json", "w"),
        )
        (run_dir / "done.json").write_text("{}")
        np.savez(
            run_dir / "embeddings.npz",
            features=features.astype(np.float16),
            values=rng.normal(size=200),
            iteration=np.ones(200),
            global_step=np.ones(200),
        )
    result = subprocess.run(
        [sys.executable, AGGREGATE, "coverage", str(tmp_path), "--grid", "20"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "tight_layout" not in result.stderr and "n_jobs" not in result.stderr, result.stderr
    table = (tmp_path / "report" / "coverage.md").read_text()
    cvg = {row.split("|")[2].strip(): float(row.split("|")[5]) for row in table.splitlines() if "| Breakout" in row}
    assert 0 < cvg["narrow"] < cvg["wide"] <= 200 / 400
    assert (tmp_path / "report" / "coverage_Breakout-v5.png").exists()


def test_aggregate_bad_input_exits_2(tmp_path, monkeypatch, capsys):
    from sweeps import aggregate  # in-process: matplotlib and rliable imported once for every case

    monkeypatch.setattr(aggregate, "DATA_NOTES", [])  # this test's warnings are not another's (each is said once)

    def error(*arguments):  # exit 2; the stderr (the curves' warnings about the runs come before their error)
        monkeypatch.setattr(sys, "argv", [AGGREGATE, *map(str, arguments)])
        with pytest.raises(SystemExit) as exited:
            aggregate.main()
        assert exited.value.code == 2
        return capsys.readouterr().err

    assert "is not a directory" in error("report", tmp_path / "missing")
    for command in ("report", "coverage"):
        stderr = error(command, tmp_path)
        assert stderr.count("\n") == 1 and "the folder of run directories" in stderr
    run_dir = make_run(tmp_path / "sweep", "Pong-v5__ppo__1__100", ["args.json"])
    writer = SummaryWriter(str(run_dir))
    writer.add_scalar("charts/SPS", 1.0, 1)
    writer.add_scalar("metrics/ddr", float("inf"), 1)  # no finite point: nothing to draw
    writer.close()
    curves = ["curves", "--out", tmp_path / "curve.png"]
    assert "not a run directory" in error(*curves, tmp_path / "sweep")  # the folder of the runs, not a run
    typo = "no run has finite points of 'charts/typo', nothing written (the runs' tags: charts/SPS, metrics/ddr)"
    assert typo in error(*curves, run_dir, "--tag", "charts/typo")
    assert "no run has finite points of 'metrics/ddr', nothing written" in error(*curves, run_dir, "--tag", "metrics/ddr")
    assert not (tmp_path / "curve.png").exists()
    # and on the command line, once: exit 2 and the one line
    result = subprocess.run([sys.executable, AGGREGATE, "report", str(tmp_path / "missing")], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "is not a directory" in result.stderr


@pytest.mark.parametrize(
    "arguments, error",
    [
        (["report", "SWEEP", "--out", "FILE"], "error: --out FILE: a file, not a folder"),  # a traceback at makedirs
        (["report", "SWEEP", "--out", "/proc/x"], "error: --out /proc/x: cannot write there"),
        (["report", "SWEEP", "--points", str(10**20)], f"error: --points {10**20}: must be at least 2, at most 100000"),
        (["report", "SWEEP", "--reps", str(10**20)], f"error: --reps {10**20}: must be at least 10, at most 1000000"),
        (["report", "SWEEP", "--baseline", "ppo2"], "error: --baseline 'ppo2': no such configuration; the sweep's: ppo"),
        (["curves", "RUN", "--smooth", str(10**20)], f"error: --smooth {10**20}: must be at least 1, at most 1000000"),
        (["curves", "RUN", "--out", "SWEEP"], "error: --out SWEEP.png: a folder, not a file"),  # SWEEP.png: a folder
        (["curves", "RUN", "--out", "/proc/x"], "error: --out /proc/x.png: cannot write there"),
        (["curves", "RUN", "--out", "FILE.txt"], "error: --out FILE.txt: not a format matplotlib writes"),
        # the edges pass: each run goes on to a later refusal (an upper-case suffix is a format matplotlib writes)
        (["curves", "RUN", "--smooth", "1", "--out", "FILE.txt"], "error: --out FILE.txt: not a format"),
        (["curves", "RUN", "--out", "/proc/x.PNG"], "error: --out /proc/x.PNG: cannot write there"),
        (["report", "SWEEP", "--points", "2", "--reps", "10", "--out", "FILE"], "error: --out FILE: a file, not a folder"),
        (["coverage", "SWEEP", "--grid", "100001"], "error: --grid 100001: must be at least 1, at most 100000"),
        (["coverage", "SWEEP", "--grid", "1", "--points-per-run", "2"], "error: --points-per-run 2: must be at least 3"),
    ],
)
def test_aggregate_refuses_bad_values_and_an_unwritable_out_in_one_line(tmp_path, arguments, error, monkeypatch, capsys):
    """Each ended in a traceback (numpy's for a huge count, the first write's for --out), after the runs were read."""
    paths = {"SWEEP": str(tmp_path / "sweep"), "RUN": str(tmp_path / "sweep" / "Pong-v5__ppo__1__100")}
    paths["FILE"] = str(tmp_path / "file")
    (tmp_path / "file").write_text("")
    (tmp_path / "sweep.png").mkdir()
    make_run(tmp_path / "sweep", "Pong-v5__ppo__1__100", ["done.json"])
    shape = {"num_envs": 8, "num_steps": 128, "schedule": None, "batch_size": 1024, "update_epochs": 4, "num_iterations": 4}
    args = {"env_id": "Pong-v5", "exp_name": "ppo", "seed": 1, **shape, "planned_steps": 4096}
    json.dump(args, open(os.path.join(paths["RUN"], "args.json"), "w"))  # a run the report reads
    writer = SummaryWriter(paths["RUN"])
    writer.add_scalar("charts/episodic_return", 1.0, 1)
    writer.close()
    replace = lambda text: re.sub("SWEEP|RUN|FILE", lambda match: paths[match[0]], text)  # noqa: E731
    from sweeps import aggregate  # in-process: matplotlib and rliable imported once for every case

    assert usage_error(aggregate.main, monkeypatch, capsys, [AGGREGATE, *map(replace, arguments)]).startswith(replace(error))
    assert not (tmp_path / "sweep" / "report").exists()  # refused before any output


def test_aggregate_curves_prints_the_file_it_wrote(tmp_path):
    """An --out without a suffix gets matplotlib's .png: it printed the path asked for, not the file written."""
    run_dir = make_run(tmp_path, "Pong-v5__ppo__1__100", ["args.json"])
    writer = SummaryWriter(str(run_dir))
    writer.add_scalar("charts/episodic_return", 1.0, 1)
    writer.close()
    result = subprocess.run(
        [sys.executable, AGGREGATE, "curves", str(run_dir), "--out", str(tmp_path / "curve")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    written = result.stdout.splitlines()[-1].removeprefix("wrote ")
    assert written == str(tmp_path / "curve.png") and os.path.isfile(written), result.stdout


def test_report_groups_schedule_runs_and_plots_what_changes_during_training(tmp_path):
    """Synthetic runs of sweeps/schedules.sh: a fixed 8 x 128 run and a growing schedule with --target-ddr. The table
    names the schedule, the N_envs plot leaves it out, and the dynamics figure gains the N_envs and clip epsilon
    panels (the only tags that change during training), not the EWMA one."""
    from torch.utils.tensorboard import SummaryWriter

    from sweeps import aggregate

    for name, schedule in (("ppo_fixed_8x128", None), ("ppo_grow", "0:8x128,0.5:32x32")):
        run_dir = tmp_path / f"Breakout-v5__{name}__1__100"
        json.dump(
            {
                "env_id": "Breakout-v5",
                "exp_name": name,
                "seed": 1,
                "num_envs": 8,
                "num_steps": 128,
                "schedule": schedule,
                "batch_size": 1024,
                "update_epochs": 4,
                "num_iterations": 4,
                "planned_steps": 4096,
            },
            open(tmp_path.joinpath(run_dir.name + ".json"), "w"),
        )
        writer = SummaryWriter(str(run_dir))
        for step in (1024, 2048, 3072, 4096):
            writer.add_scalar("charts/episodic_return", step / 100, step)
            writer.add_scalar("charts/num_envs", 8 if schedule is None or step <= 2048 else 32, step)
            writer.add_scalar("charts/clip_coef", 0.1 if schedule is None else 0.1 + step / 1e5, step)
            writer.add_scalar("charts/ewma_com", 8.0, step)
            writer.add_scalar("metrics/ddr", 1e5, step)
            writer.add_scalar("charts/SPS", 500, step)
        writer.close()
        os.replace(tmp_path / f"{run_dir.name}.json", run_dir / "args.json")
        (run_dir / "done.json").write_text("{}")
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.5, 20, 200, pdf=False, include_unfinished=False)
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| ppo_grow | schedule 0:8x128,0.5:32x32 |  | 1024 |" in table and "| ppo_fixed_8x128 | 8 | 128 | 1024 |" in table
    groups = aggregate.group_runs(aggregate.load_runs(str(tmp_path), include_unfinished=False))
    colors = aggregate.config_colors(sorted(groups))
    tags = aggregate.plot_metric_curves(groups, np.linspace(0, 4096, 9)[1:], colors, str(tmp_path / "dynamics.png"), False)
    assert tags == ["metrics/ddr", "charts/num_envs", "charts/clip_coef"] and (tmp_path / "dynamics.png").exists()
    # benchmarks/schedule_runs.py: RESULTS.md's table, means by thirds of the 4096 steps (1024 | 2048 | 3072, 4096)
    summary = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "schedule_runs.py"), str(tmp_path), "--final-fraction", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert summary.returncode == 0, summary.stderr
    assert (
        "| ppo_grow | 1 | 4 | 35.84 (2 games) | 25.60 | 8 / 8 / 32 | 0.11 / 0.12 / 0.136 | 1e+05 / 1e+05 / 1e+05 | 500 |"
        in (summary.stdout.splitlines())
    )


def test_report_leaves_out_non_finite_points_draws_no_score_where_a_run_has_none_and_sorts_numbers(
    tmp_path, capsys, monkeypatch
):
    """A NaN return or an inf DDR (a KL of 0) is a noted datum left out, not a run lost from the table or a curve cut
    short; a run's DDR is its median; a curve is a gap before a run's first episode and past its last step (it
    repeated the nearest value); configurations sort as numbers; one seed has no CI (nor a bar), also against a
    --baseline; the N_envs plot joins the fixed-budget sweep's lone points by batch; `curves --strict` fails when a run
    lacks the tag. The runs are read in this process, as where no process pool can start."""
    from torch.utils.tensorboard import SummaryWriter

    from sweeps import aggregate

    aggregate.DATA_NOTES.clear()
    shapes = {"ppo_envs8_steps128": 10_000, "ppo_envs16_steps64": 6_000, "ppo_envs128_steps8": 10_000}  # name: budget
    for name, budget in shapes.items():
        envs, steps = (int(number) for number in re.findall(r"\d+", name))
        run_dir = tmp_path / f"Pong-v5__{name}__1__100"
        writer = SummaryWriter(str(run_dir))
        for step in range(2_000, budget + 1, 1_000):  # the first game ends at step 2,000
            nan = name == "ppo_envs8_steps128" and step == 5_000
            writer.add_scalar("charts/episodic_return", float("nan") if nan else 10.0, step)
            last = name == "ppo_envs128_steps8" and step == budget  # the annealed LR's last KL, near 0
            writer.add_scalar("metrics/ddr", float("inf") if nan else 1e9 if last else 1e4, step)
        writer.close()
        flags = {"env_id": "Pong-v5", "exp_name": name, "seed": 1, "num_envs": envs, "num_steps": steps, "schedule": None}
        flags |= {"batch_size": envs * steps, "update_epochs": 4, "planned_steps": budget}
        (run_dir / "args.json").write_text(json.dumps(flags))
        (run_dir / "done.json").write_text("{}")
    out_dir, baseline = str(tmp_path / "report"), "ppo_envs128_steps8"
    no_semaphores = NotImplementedError("This Python has no working sem_open")  # some containers: read in this process
    monkeypatch.setattr(aggregate.concurrent.futures, "ProcessPoolExecutor", lambda *_: (_ for _ in ()).throw(no_semaphores))
    aggregate.report(str(tmp_path), out_dir, 0.1, 10, 100, pdf=False, include_unfinished=False, baseline=baseline)
    notes = capsys.readouterr().err
    for tag in ("charts/episodic_return", "metrics/ddr"):
        assert f"Pong-v5__ppo_envs8_steps128__1__100: 1 non-finite {tag} point(s) left out (first at step 5,000)" in notes
    table = [line for line in (tmp_path / "report" / "report.md").read_text().splitlines() if line.startswith("| ppo_")]
    assert [line.split(" | ")[0] for line in table[:3]] == [
        "| ppo_envs8_steps128",
        "| ppo_envs16_steps64",
        "| ppo_envs128_steps8",
    ]
    assert table[0].endswith("| 1 | 0.870 (1 run: no CI) | 0.870 | 1e+04 |")  # Pong 10: (10 + 20.7) / (14.6 + 20.7)
    assert table[2].endswith("| 1e+04 |")  # the median DDR: the mean, 1.1e+08, is the last iteration's
    improvement = (tmp_path / "report" / "report.md").read_text().split(f"P(X > {baseline}) [95 % CI] |\n|---|---|\n")[1]
    assert improvement.splitlines()[:2] == [
        "| ppo_envs8_steps128 | 0.500 (1 run: no CI) |",
        "| ppo_envs16_steps64 | 0.500 (1 run: no CI) |",
    ]
    runs = {run["config"]: run for run in aggregate.load_runs(str(tmp_path), include_unfinished=False)}
    grid = np.linspace(0, 10_000, 11)[1:]  # (0, 1000], (1000, 2000], ...
    assert (
        np.isnan(aggregate.score_curve(runs["ppo_envs8_steps128"], grid)[0])
        and not np.isnan(aggregate.score_curve(runs["ppo_envs8_steps128"], grid)[1:]).any()
    )
    assert np.isnan(aggregate.score_curve(runs["ppo_envs16_steps64"], grid)).tolist() == [True] + [False] * 5 + [True] * 4
    rows = [
        {"config": name, "num_steps": runs[name]["args"]["num_steps"], "batch_size": 1024, "schedule": None} for name in runs
    ]
    assert list(aggregate.score_series(rows)) == ["ppo, batch = 1024"]
    figures = []
    monkeypatch.setattr(aggregate, "save", lambda figure, path, pdf: figures.append(figure))
    curves = {"ppo_envs8_steps128": aggregate.score_curve(runs["ppo_envs8_steps128"], grid)[None, None]}
    aggregate.plot_iqm_curves(curves, grid, {"ppo_envs8_steps128": "C0"}, "human-normalised score", 100, "unused", False)
    assert figures[0].axes[0].get_ylabel() == "IQM human-normalised score"  # not the last line's name
    aggregate.plot_improvement({"a": (0.5, None), "b": (0.7, [0.6, 0.8])}, "c", {"a": "C0", "b": "C1"}, "unused", False)
    assert [(bar.get_x(), bar.get_width()) for bar in figures[1].axes[0].patches] == [(0.6, pytest.approx(0.2))]  # b's
    (tmp_path / "Pong-v5__other__1__100").mkdir()
    writer = SummaryWriter(str(tmp_path / "Pong-v5__other__1__100"))
    writer.add_scalar("charts/episodic_return", 1.0, 100)
    writer.close()
    run_dirs = [str(tmp_path / "Pong-v5__ppo_envs8_steps128__1__100"), str(tmp_path / "Pong-v5__other__1__100")]
    out = str(tmp_path / "ddr.png")
    strict = subprocess.run(
        [sys.executable, AGGREGATE, "curves", "--strict", "--tag", "metrics/ddr", "--out", out, *run_dirs],
        capture_output=True,
        text=True,
    )
    assert (
        strict.returncode == 1
        and "Pong-v5__other__1__100: no 'metrics/ddr' scalars yet: left out of the plot" in strict.stderr
    )


def test_a_report_of_runs_in_which_no_episode_ended_is_still_written(tmp_path, capsys):
    """A tiny sweep in which no game ended: no final score anywhere (each run noted), and the DDR plot, with nothing
    to draw on its log axis, is left out instead of ending the report in matplotlib's traceback."""
    from torch.utils.tensorboard import SummaryWriter

    from sweeps import aggregate

    aggregate.DATA_NOTES.clear()
    for name in ("ppo_envs8_steps32", "ppo_envs16_steps16"):
        run_dir = tmp_path / f"Pong-v5__{name}__1__100"
        writer = SummaryWriter(str(run_dir))
        for step in (256, 512):
            writer.add_scalar("metrics/ddr", 1e4, step)
        writer.close()
        flags = {"env_id": "Pong-v5", "exp_name": name, "seed": 1, "num_envs": 8, "num_steps": 32, "schedule": None}
        (run_dir / "args.json").write_text(json.dumps(flags | {"batch_size": 256, "update_epochs": 4, "planned_steps": 512}))
        (run_dir / "done.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_status:  # every configuration is left out: nothing to aggregate, exit 1
        aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.1, 10, 100, pdf=False, include_unfinished=False)
    err = capsys.readouterr().err
    assert exit_status.value.code == 1 and err.count("no episode ended with a finite return: no final score") == 2
    assert err.strip().splitlines()[-1].startswith("error: nothing left to aggregate: every configuration was left out")
    report = (tmp_path / "report" / "report.md").read_text()  # the curves and the notes, no empty table
    assert "ddr_vs_score.png" not in report and "| configuration |" not in report and "iqm_curves.png" not in report
    assert all((tmp_path / "report" / name).exists() for name in re.findall(r"!\[(.+?)\]", report))


def test_a_sweep_whose_every_configuration_is_left_out_says_nothing_is_left_and_exits_1(tmp_path):
    """Each configuration ran on one game only (no configuration has a run on every game): the aggregate is empty. The
    report said so with no word, warned about pooling Hopper's raw returns with Breakout's normalised scores over empty
    tables, and exited 0."""
    for config, game in (("a", "Breakout-v5"), ("b", "Hopper-v4")):
        run_dir = tmp_path / f"{game}__{config}__1__100"
        writer = SummaryWriter(str(run_dir))
        for step in range(100, 1001, 100):
            writer.add_scalar("charts/episodic_return", 10.0, step)
        writer.close()
        flags = {"env_id": game, "exp_name": config, "seed": 1, "num_envs": 8, "num_steps": 32, "schedule": None}
        (run_dir / "args.json").write_text(json.dumps(flags | {"batch_size": 256, "update_epochs": 4, "planned_steps": 1000}))
        (run_dir / "done.json").write_text("{}")
    command = [sys.executable, os.path.join(ROOT, "sweeps", "aggregate.py"), "report", str(tmp_path), "--reps", "10"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        "warning: a: no run on Hopper-v4: left out of the aggregate",
        "warning: b: no run on Breakout-v5: left out of the aggregate",
        "error: nothing left to aggregate: every configuration was left out (the data notes say why); "
        f"{tmp_path / 'report' / 'report.md'} has the curves only",
    ]
    assert "nothing left to aggregate" in (tmp_path / "report" / "report.md").read_text()


def flag_values(command, *flags):
    words = shlex.split(command)
    return tuple(words[words.index(flag) + 1] for flag in flags)


@pytest.mark.parametrize("sweep", SWEEPS, ids=os.path.basename)
def test_sweep_refuses_arguments_and_an_unknown_scale_before_anything_runs(sweep, tmp_path):
    refusals = (
        (["--help"], {}),
        ([], {"SCALE": "papr"}),
        ([], {"BACKEND": "auto"} if "continuous" in sweep else {"SCALE": "x"}),
    )
    for arguments, setting in refusals:
        env = {**os.environ, "LOG_DIR": str(tmp_path / "logs"), "PYTHON": "false", **setting}
        result = subprocess.run(["bash", sweep, *arguments], capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
        assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("sweep", SCRIPT_SWEEPS)
def test_no_sweep_trains_the_same_run_twice(sweep, tmp_path, monkeypatch):
    """At paper scale a repeated run is days of GPU time: no two commands of a sweep train the same thing, compared by
    the flags the script parses (defaults filled in; the run's name, directory and checkpoint interval aside, and the LR
    scaling where N_envs is its reference, as every scaling then leaves the LR as it is). One game and seed suffice: a
    sweep repeats the same grid for each."""
    import dataclasses

    commands = sweep_commands(sweep, tmp_path, "paper")
    first = shlex.split(commands[0])
    task = ["--env-id"] if "--env-id" in first else ["--task-set", "--env-size"]  # ppo_kinetix.py: set and size
    game_and_seed = [f"{flag} {first[first.index(flag) + 1]} " for flag in [*task, "--seed"]]
    commands = [command for command in commands if all(part in command + " " for part in game_and_seed)]
    trainings = []
    for command in commands:
        words = shlex.split(command)
        script = os.path.basename(words[1])
        args = dataclasses.asdict(parse_command(words[1:], monkeypatch))
        for name in ("exp_name", "runs_dir", "checkpoint_interval"):
            args.pop(name, None)
        if "phases" in args:  # they hold the minibatch size they give: the size or count given is one of two spellings
            args.pop("minibatch_size"), args.pop("num_minibatches")
        if args.get("num_envs") == args.get("lr_reference_envs"):
            args["lr_scaling"] = "none"
        trainings.append((script, repr(sorted(args.items()))))
    repeated = [command for command, training in zip(commands, trainings, strict=True) if trainings.count(training) > 1]
    assert len(trainings) > 1 and not repeated, repeated[:4]


def test_epochs_sweep_grows_the_batch_by_more_envs_and_by_longer_rollouts(tmp_path):
    """Paper Fig. 1c: epochs x 2 and x 4 "while simultaneously increasing N_envs and N_RO" (Sec. 4.2)."""
    shapes = {("8", "128"), ("16", "128"), ("32", "128"), ("8", "256"), ("8", "512")}
    commands = sweep_commands(os.path.join(ROOT, "sweeps", "epochs.sh"), tmp_path, "paper")
    grid = {flag_values(command, "--num-envs", "--num-steps", "--update-epochs") for command in commands}
    assert grid == {(*shape, epochs) for shape in shapes for epochs in ("4", "8", "16")}
    assert len({flag_values(command, "--exp-name") for command in commands}) == len(grid)


def test_lr_gamma_sweep_doubles_the_rollout_for_every_gamma(tmp_path):
    """Paper Fig. 12: "Performance gains from N_RO x 2 are unaffected by varying gamma"."""
    commands = sweep_commands(os.path.join(ROOT, "sweeps", "lr_gamma.sh"), tmp_path, "paper")
    gamma_runs = [command for command in commands if "--gamma " in command]
    grid = {flag_values(command, "--gamma", "--num-envs", "--num-steps") for command in gamma_runs}
    expected = {(gamma, "8", steps) for gamma in ("0.95", "0.99", "0.995", "0.999") for steps in ("128", "256")}
    # gamma 0.99 at 8 x 128 is the baseline of the LR runs, run once
    assert grid == expected - {("0.99", "8", "128")}
    baseline = [command for command in commands if "--exp-name ppo_lr-none_envs8 " in command]
    assert baseline and flag_values(baseline[0], "--num-envs", "--num-steps") == ("8", "128") and "--gamma" not in baseline[0]
    assert len({flag_values(command, "--exp-name") for command in gamma_runs}) == len(grid)


def kinetix_flags(command):
    """{flag: value} of a printed ppo_kinetix.py command (--anneal-lr / --no-anneal-lr: "yes" / "no")."""
    words = shlex.split(command)
    assert os.path.basename(words[1]) == "ppo_kinetix.py", command
    flags = {}
    for i, word in enumerate(words[2:], start=2):
        if word.startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
            name = word.removeprefix("--no-") if value is None and word.startswith("--no-") else word[2:]
            flags[name] = value if value is not None else ("no" if word.startswith("--no-") else "yes")
    return flags


def test_kinetix_sweep_covers_each_figures_values_once(tmp_path):
    """sweeps/kinetix.sh: Beukman et al.'s Fig. 1a (= 5a), 4, 5, 6, 7, 8, 9 at SCALE=paper: Table 2's 2048 envs x 256 steps,
    8 epochs, 32 minibatches (of 16,384), 512 morphologies, 5 seeds; each figure's swept values around that base; a
    run that several figures share listed once; a name per configuration (its run directory)."""
    commands = sweep_commands(KINETIX, tmp_path, "paper")
    runs = [kinetix_flags(command) for command in commands]
    assert {run["seed"] for run in runs} == {"1", "2", "3", "4", "5"} and len(runs) == 5 * 83
    assert {(run["task-set"], run["env-size"], run["num-tasks"], run["num-steps"], run["eval-interval"]) for run in runs} == {
        ("locomotion", "l", "512", "256", "50")  # the solve rate every 50 iterations, as Kinetix's evaluation configs
    }
    seed_1 = [run for run in runs if run["seed"] == "1"]
    names = [run["exp-name"] for run in seed_1]
    assert len(set(names)) == len(names) == 83  # no configuration twice
    without_name = [tuple(sorted((k, v) for k, v in run.items() if k != "exp-name")) for run in seed_1]
    assert len(set(without_name)) == len(without_name)  # no training twice under two names
    base = {"clip-coef": "0.2", "update-epochs": "8", "learning-rate": "3e-4", "anneal-lr": "no", "num-envs": "2048"}
    base |= {"num-minibatches": "32", "total-timesteps": str(2**30)}  # Kinetix's PPO budget: 2,048 iterations

    def grid(*axes, **fixed):  # the values of `axes` over the runs that hold the base's values elsewhere (and `fixed`)
        fixed = base | fixed
        return {
            tuple(run.get(axis) for axis in axes)
            for run in seed_1
            if all(run.get(flag) == value for flag, value in fixed.items() if flag not in axes)
        }

    assert {("8",), ("32",), ("128",), ("512",)} <= grid("ewma-com")  # Fig. 1a: PPO-EWMA's centre of mass
    fig_4 = {(com, lr, anneal) for com in ("8", "128") for lr in ("1e-4", "3e-4", "1e-3") for anneal in ("yes", "no")}
    assert fig_4 <= grid("ewma-com", "learning-rate", "anneal-lr")
    clips = {"0.05", "0.1", "0.2", "0.4", "0.6"}  # Fig. 5: clip epsilon, PPO and PPO-EWMA
    assert clips <= {clip for clip, com in grid("clip-coef", "ewma-com") if com is None}
    assert {(clip, "128") for clip in clips} <= grid("clip-coef", "ewma-com")
    epochs = ("1", "2", "4", "8", "16")  # Fig. 6: epochs x COM (a), x clip (b, eps 0 included)
    assert {(e, com) for e in epochs for com in ("8", "128")} <= grid("update-epochs", "ewma-com")
    assert {(e, clip, None) for e in epochs for clip in ("0", "0.2", "0.6")} <= grid("update-epochs", "clip-coef", "ewma-com")
    # Fig. 7: N_envs at 32 minibatches, as many updates as the base (2,048 iterations of 2048 x 256), x COM and x clip
    for envs in ("16", "512", "8192"):  # a rollout of 4,096; a minibatch of 4,096 (Sec. 4.3); a larger one
        budget = str(2048 * int(envs) * 256)
        regularisation = grid("ewma-com", "clip-coef", **{"num-envs": envs, "total-timesteps": budget})
        assert {("8", "0.2"), ("128", "0.2"), (None, "0.2"), (None, "0.6")} <= regularisation, envs
        same_updates = [run["exp-name"] for run in seed_1 if (run["num-envs"], run["total-timesteps"]) == (envs, budget)]
        assert all(name.endswith("_sameupdates") for name in same_updates), same_updates
    # Fig. 8: Fig. 1a's COMs and Fig. 5's clips (PPO) at each budget, the base's N_envs; a name per budget
    regularisations = {(com, "0.2") for com in ("8", "32", "128", "512")} | {(None, clip) for clip in clips}
    for budget in (2**28, 2**30, 2**32):
        assert regularisations <= grid("ewma-com", "clip-coef", **{"total-timesteps": str(budget)}), budget
    at_base = [run for run in seed_1 if run["num-envs"] == "2048"]  # (Fig. 7's 8192 envs also train 2^32 steps)
    assert {run["exp-name"].rsplit("_", 1)[1] for run in at_base if run["total-timesteps"] == str(2**32)} == {f"budget{2**32}"}
    # Fig. 9: N_envs three ways: minibatches of 16,384; 32 minibatches at the LR; 32 minibatches at the LR x sqrt(k)
    recipes = {
        envs: grid("minibatch-size", "num-minibatches", "lr-scaling", "lr-reference-envs", **{"num-envs": envs})
        for envs in ("256", "1024", "8192")
    }
    for envs, splits in recipes.items():
        assert splits == {("16384", None, None, None), (None, "32", None, None), (None, "32", "sqrt", "2048")}, envs
    assert any("--num-envs 2048 --num-steps 256 " in command for command in commands)
    cpu = [kinetix_flags(command) for command in sweep_commands(KINETIX, tmp_path, "cpu")]
    assert len(cpu) == 22 and {(run["env-size"], run["num-tasks"], run["num-steps"], run["eval-interval"]) for run in cpu} == {
        ("m", "16", "32", "10")
    }
    assert max(int(run["total-timesteps"]) for run in cpu) <= 500_000 and max(int(run["num-envs"]) for run in cpu) <= 256
    env = {**os.environ, "LAUNCHER": "print", "FIGURES": "9", "RECIPE_ENVS": "128", "TASK_SETS": "random handmade"}
    nine = subprocess.run(["bash", KINETIX], capture_output=True, text=True, env=env, timeout=60)
    assert nine.returncode == 0 and len(nine.stdout.splitlines()) == 2 * 4, nine.stderr  # base + 3 recipes at 128, 2 sets
    refused = subprocess.run(["bash", KINETIX], capture_output=True, text=True, env={**env, "FIGURES": "1a 3"}, timeout=60)
    assert refused.returncode == 2 and refused.stdout == "" and "FIGURES holds '3'" in refused.stderr


@NO_KINETIX_SCRIPT
def test_kinetix_sweep_gives_only_flags_of_ppo_kinetix(tmp_path, monkeypatch):
    """Every command of both scales parses with ppo_kinetix.py's own Args (tyro refuses a flag it does not have) and
    each swept flag lands in the field of its name."""
    import importlib

    module = importlib.import_module("ppo_kinetix")
    for command in {*sweep_commands(KINETIX, tmp_path, "cpu"), *sweep_commands(KINETIX, tmp_path, "paper")}:
        words = shlex.split(command)
        monkeypatch.setattr(sys, "argv", ["ppo_kinetix.py", *words[2:]])
        args = module.parse_args()[0]
        flags = kinetix_flags(command)
        assert args.num_envs == int(flags["num-envs"]) and args.num_steps == int(flags["num-steps"])
        assert args.update_epochs == int(flags["update-epochs"]) and args.clip_coef == float(flags["clip-coef"])
        assert args.anneal_lr == (flags["anneal-lr"] == "yes") and args.total_timesteps == int(flags["total-timesteps"])
        assert args.ewma_com == (float(flags["ewma-com"]) if "ewma-com" in flags else None)
        assert args.eval_interval == int(flags["eval-interval"])


def test_launcher_finds_a_kinetix_run_by_its_task_set_and_size(tmp_path):
    """ppo_kinetix.py has no --env-id: its run directory is Kinetix-<set>-<size>__<exp_name>__<seed>__<time>, which
    launch.sh names from --task-set and --env-size to skip a finished run (and resume an interrupted one)."""
    run_dir = make_run(tmp_path / "runs", "Kinetix-locomotion-s__ppo__3__100", ["done.json"])
    (run_dir / "args.json").write_text(json.dumps({"script": "ppo_kinetix.py", "env_id": "Kinetix-locomotion-s", "seed": 3}))
    command = "echo ppo_kinetix.py --task-set {} --env-size s --seed 3 --exp-name ppo --runs-dir runs"
    result = launch(f"{command.format('locomotion')}\n{command.format('random')}\n", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[1] skipped (finished)" in result.stdout and "[2] start: echo ppo_kinetix.py --task-set random" in result.stdout


@pytest.mark.parametrize("backend, games, run_name", [("mjwarp", "Ant-v5", "Ant"), ("envpool", "Ant", "Ant-v5")])
def test_continuous_sweep_skips_its_finished_runs_on_every_backend(tmp_path, backend, games, run_name):
    """ppo_isaacgym.py names the task Ant on MuJoCo Warp and Isaac Gym, Ant-v5 on EnvPool, in its run directories:
    the sweep's --env-id must be that name for launch.sh to find a finished run."""
    make_run(tmp_path / "runs", f"{run_name}__ppo_envs64_steps16__1__100", ["args.json", "done.json"])
    env = {
        **os.environ,
        **dict(BACKEND=backend, GAMES=games, SEEDS="1", BASE="64x16", MULTIPLIERS="1", PYTHON="true"),
        **dict(RUNS_DIR=str(tmp_path / "runs"), LOG_DIR=str(tmp_path / "logs")),
    }
    result = subprocess.run(["bash", os.path.join(ROOT, "sweeps", "continuous.sh")], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"--env-id {run_name} " in result.stdout and "launched 0 (0 resumed from a checkpoint), skipped 1" in result.stdout


FAKE_TRAINING = """#!/usr/bin/env bash
# A stand-in for PYTHON: "trains" the run its flags name (args.json, checkpoint.pt holding the run's name, done.json),
# after reading --init-from's checkpoint into init.txt; the run named in $FAIL crashes before it finishes.
while (($#)); do
    case $1 in
    --env-id) env=$2 ;; --exp-name) name=$2 ;; --seed) seed=$2 ;; --runs-dir) runs=$2 ;; --init-from) init=$2 ;;
    esac
    shift
done
dir=$runs/${env}__${name}__${seed}__$(date +%s%N)
mkdir -p "$dir" && echo '{}' >"$dir/args.json"
if [[ -n ${init:-} ]]; then cat "$init" >"$dir/init.txt" || exit 3; fi
[[ $name == "${FAIL:-}" ]] && exit 1
echo "$name" >"$dir/checkpoint.pt" && echo '{}' >"$dir/done.json"
"""


def test_restart_sweep_starts_each_restart_from_its_finished_base_and_leaves_the_others_for_a_re_run(tmp_path):
    """sweeps/restart.sh (Beukman Fig. 3a) in two stages: the base runs, then the restarts from the copies of their last
    checkpoints; a base that has not finished holds back its restarts (a notice, exit 1 as its failure) until a re-run,
    which skips what is done."""
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_TRAINING)
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHON": str(fake), "RUNS_DIR": str(runs), "LOG_DIR": str(tmp_path / "logs"), "JOBS": "2"}
    env |= {"GAMES": "Breakout", "SEEDS": "3", "TOTAL_TIMESTEPS": "4096", "COMS": "1 64", "FAIL": "ewma_com64_base"}
    sweep = os.path.join(ROOT, "sweeps", "restart.sh")
    first = subprocess.run(["bash", sweep], capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "Breakout-v5 ewma_com64_base (seed 3) has not finished: its restarts wait" in first.stderr
    assert sorted(path.name for path in (runs / "init").iterdir()) == ["Breakout-v5__ewma_com1_base__3.pt"]

    def trained():  # run name: the base its init.txt came from, or "" for a base
        done = [path.parent for path in runs.glob("*/done.json")]
        return {
            path.name.split("__")[1]: (path / "init.txt").read_text().strip() if (path / "init.txt").exists() else ""
            for path in done
        }

    assert trained() == {"ewma_com1_base": "", "ewma_com1_from1": "ewma_com1_base", "ewma_com64_from1": "ewma_com1_base"}
    env |= {"FAIL": "", "LOG_DIR": str(tmp_path / "logs_again")}
    again = subprocess.run(["bash", sweep], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and again.stderr == "", again.stdout + again.stderr
    assert "launched 1 (0 resumed from a checkpoint), skipped 1 finished" in again.stdout  # the bases
    assert "launched 2 (0 resumed from a checkpoint), skipped 2 finished" in again.stdout  # the restarts
    restarts = {f"ewma_com{to}_from{base}": f"ewma_com{base}_base" for base in (1, 64) for to in (1, 64)}
    assert trained() == {"ewma_com1_base": "", "ewma_com64_base": "", **restarts}
    restart_logs = [log.read_text().splitlines()[0] for log in (tmp_path / "logs_again" / "restarts").glob("*.log")]
    assert len(restart_logs) == 2 and all("_from64 " in line for line in restart_logs)  # the second run's log files
    # each restart's command: the base's checkpoint at its fixed path, with Adam's moments
    assert all(
        f"--init-from {runs}/init/Breakout-v5__ewma_com" in line and "--init-optimizer" in line for line in restart_logs
    )
    assert all("--no-anneal-lr --total-timesteps 2048 " in line for line in restart_logs)  # the second half, at a constant LR


def test_a_restart_that_was_interrupted_resumes_from_its_own_checkpoint(tmp_path):
    """A run started with --init-from that stopped resumes with --resume alone (the scripts refuse both): launch.sh drops
    --init-from and --init-optimizer, wherever they stand in the command."""
    recorded = {"init_from": "base.pt", "init_optimizer": True}
    for name in ("a", "b"):
        (make_run(tmp_path / "runs", f"Pong-v5__{name}__1__100", ["checkpoint.pt"]) / "args.json").write_text(
            json.dumps(recorded)
        )
    commands = (
        "echo x.py --env-id Pong-v5 --exp-name a --init-from base.pt --init-optimizer --runs-dir runs\n"
        "echo x.py --env-id Pong-v5 --init-optimizer --exp-name b --runs-dir runs --init-from=base.pt\n"
    )
    result = launch(commands, tmp_path)
    assert result.returncode == 0, result.stdout
    for name in ("a", "b"):
        resumed = (
            f"echo x.py --env-id Pong-v5 --exp-name {name} --runs-dir runs --resume runs/Pong-v5__{name}__1__100/checkpoint.pt"
        )
        assert f"start: {resumed}\n" in result.stdout, result.stdout


def test_issue_58_rows_at_paper_scale(tmp_path):
    """The rows the sweeps gained for issue 58, at SCALE=paper: N_envs 1, 2, 4 in the data scaling (the rebuttal's
    table); the LR divided by sqrt(k) (Fig. 11); Table 1's PQN exploration; a third continuous task; PPO's clip epsilon
    at every N_envs (Beukman Fig. 5b, 7b); Fig. 4's LR x COM x annealing and Fig. 6's epochs x regularisation; Fig. 9 on
    continuous control."""

    def commands(name, **env):
        result = subprocess.run(
            ["bash", os.path.join(ROOT, "sweeps", f"{name}.sh")],
            capture_output=True,
            text=True,
            env={**os.environ, "LAUNCHER": "print", "SCALE": "paper", "GAMES": "Amidar", "SEEDS": "1", **env},
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    scaling = {flag_values(command, "--num-envs", "--num-steps") for command in commands("data_scaling")}
    assert {(envs, "128") for envs in ("1", "2", "4", "8", "16", "32", "64", "128")} <= scaling and len(scaling) == 12
    assert {flag_values(c, "--lr-scaling")[0] for c in commands("lr_gamma") if "--lr-scaling" in c} == {
        "none",
        "sqrt",
        "linear",
        "inverse-sqrt",
        "inverse",
    }
    assert all("--exploration-fraction 0.0025 --end-e 0.011 " in command for command in commands("pqn"))
    for backend, tasks in (("envpool", {"Ant-v5", "Humanoid-v5", "Walker2d-v5"}), ("isaacgym", {"Ant", "Humanoid", "Anymal"})):
        env = {"BACKEND": backend, "GAMES": ""}  # empty: the backend's paper-scale tasks
        for name in ("continuous", "continuous_recipe"):
            assert {flag_values(command, "--env-id")[0] for command in commands(name, **env)} == tasks, (name, backend)
    ppo_clips = {
        flag_values(c, "--num-envs", "--clip-coef")
        for c in commands("ewma_recipe")
        if "ppo_atari_envpool.py" in c and "--clip-coef" in c
    }
    assert ppo_clips == {(envs, clip) for envs in ("8", "32", "128") for clip in ("0.2", "0.4")}  # 0.1: bigger-minibatches
    from sweeps.aggregate import envs_series

    # Fig. 8's budgets (and kinetix.sh's): a run at another budget is not a point of its base's N_envs line
    for name, budgets in (("ewma_recipe", "25000000 100000000"), ("kinetix", "268435456 1073741824")):
        runs = [flag_values(c, "--exp-name", "--total-timesteps") for c in commands(name, BUDGETS=budgets, FIGURES="8")]
        lines = {(envs_series(config, "N_RO = 256"), budget) for config, budget in runs}
        assert len({line for line, _ in lines}) == len(lines) and len({budget for _, budget in lines}) == 2, (name, lines)
    outer = commands("outer_step")
    fig_4 = {
        (*flag_values(c, "--ewma-com", "--learning-rate"), " --anneal-lr " in c)
        for c in outer
        if "--update-epochs 4 " in c and "--ewma-com" in c
    }
    assert fig_4 == {
        (com, lr, anneal) for com in ("1", "8", "64") for lr in ("1e-4", "2.5e-4", "1e-3") for anneal in (True, False)
    }
    fig_6b = {flag_values(c, "--update-epochs", "--clip-coef") for c in outer if "ppo_atari_envpool.py" in c}
    assert fig_6b == {(epochs, clip) for epochs in ("1", "2", "4", "8", "16") for clip in ("0", "0.1", "0.3")}
    assert len(outer) == 41 and len({flag_values(c, "--exp-name") for c in outer}) == 41
    (more,) = [c for c in commands("continuous_recipe", GAMES="Ant-v5") if "--exp-name ppo_more-minibatches_envs16384 " in c]
    assert "--minibatch-size 8192 " in more  # the base's 1024 x 16 in 2 minibatches: 32 of 8,192 at 16,384 envs


def fake_run(env_id, config, seed, returns, num_envs=8, num_steps=128):
    """A loaded run (as load_runs returns it) whose episodes end in the last tenth of its 1000 steps."""
    return {
        "dir": f"/runs/{env_id}__{config}__{seed}__100",
        "args": {"num_envs": num_envs, "num_steps": num_steps},
        "env_id": env_id,
        "config": config,
        "seed": seed,
        "total_steps": 1000,
        "scalars": {"charts/episodic_return": (np.full(len(returns), 950), np.array(returns, dtype=float))},
    }


def test_final_score_is_the_mean_of_the_episodes_in_the_last_fraction_of_training():
    from sweeps import aggregate

    run = fake_run("Hopper-v4", "a", 1, [1.0, 2.0, 9.0])  # raw returns: no normalisation
    run["scalars"]["charts/episodic_return"] = (np.array([50, 500, 950]), np.array([1.0, 2.0, 9.0]))
    assert aggregate.final_score(run, 0.1) == 9.0  # the episode ending after step 900 of 1000
    assert aggregate.final_score(run, 0.6) == 5.5  # after step 400


def test_score_matrices_leave_out_unscored_runs_and_extra_seeds_with_a_note(monkeypatch):
    """A run without an episode (no final score) must not turn its configuration's IQM into nan, and the seeds that
    the (runs, games) matrix cannot hold are left out with a note, like every other datum the report drops."""
    from sweeps import aggregate

    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    by_game = {
        "Breakout-v5": [fake_run("Breakout-v5", "a", seed, [] if seed == 2 else [10.0 * seed]) for seed in (1, 2, 3, 4)],
        "Pong-v5": [fake_run("Pong-v5", "a", seed, [seed - 20.0]) for seed in (1, 2, 3, 4)],
    }
    matrices, kept = aggregate.score_matrices({"a": by_game}, ["Breakout-v5", "Pong-v5"], 0.1)
    breakout = metrics.human_normalized_score("Breakout-v5", np.array([10.0, 30.0, 40.0]))
    pong = metrics.human_normalized_score("Pong-v5", np.array([-19.0, -18.0, -17.0]))
    np.testing.assert_allclose(matrices["a"], np.stack([breakout, pong], axis=1))
    assert [run["seed"] for run in kept["a"]["Breakout-v5"]] == [1, 3, 4] and len(kept["a"]["Pong-v5"]) == 3
    assert any(
        note.startswith("Breakout-v5__a__2__100: no episode ended with a finite return: no final score")
        for note in aggregate.DATA_NOTES
    )
    assert any(note.startswith("Pong-v5__a__4__100: left out of the aggregate") for note in aggregate.DATA_NOTES)


def test_score_vs_num_envs_draws_one_line_per_configuration(monkeypatch):
    """The epochs sweep (Fig. 1c): every configuration has N_RO = 128; a line must join the N_envs of one epoch count,
    not every run with the same N_RO."""
    from sweeps import aggregate

    figures = []
    monkeypatch.setattr(aggregate, "save", lambda figure, path, pdf: figures.append(figure))
    summary = [
        {"config": f"ppo_envs{envs}_steps128_epochs{epochs}", "num_envs": envs, "num_steps": 128, "schedule": None}
        | {"iqm": envs * epochs, "ci": (0.0, 1e3), "batch_size": envs * 128}
        for epochs in (4, 8)
        for envs in (8, 16, 32)
    ]
    summary.append({"config": "ppo_envs8_steps256_epochs4", "num_envs": 8, "num_steps": 256, "schedule": None, "iqm": 1})
    summary[-1]["batch_size"] = 2048  # by batch, 6 lines: by N_RO, 3
    summary[-1]["ci"] = (0.0, 2.0)
    aggregate.plot_score_vs_envs(summary, "score", "unused.png", False)
    lines = {
        container.get_label(): (list(container.lines[0].get_xdata()), list(container.lines[0].get_ydata()))
        for container in figures[0].axes[0].containers
    }
    assert lines == {
        "ppo_epochs4, N_RO = 128": ([8, 16, 32], [32, 64, 128]),
        "ppo_epochs8, N_RO = 128": ([8, 16, 32], [64, 128, 256]),
        "ppo_epochs4, N_RO = 256": ([8], [1]),
    }


def test_a_configuration_left_out_of_the_aggregate_is_a_data_note(monkeypatch):
    """--strict promises exit 1 whenever the report leaves data out: a configuration without a run on one of the games
    is not in the IQM table, so it is listed with the other notes."""
    from sweeps import aggregate

    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    groups = {
        "a": {"Breakout-v5": [fake_run("Breakout-v5", "a", 1, [10.0])], "Pong-v5": [fake_run("Pong-v5", "a", 1, [-5.0])]},
        "b": {"Breakout-v5": [fake_run("Breakout-v5", "b", 1, [10.0])]},
        "c": {"Breakout-v5": [fake_run("Breakout-v5", "c", 1, [])], "Pong-v5": [fake_run("Pong-v5", "c", 1, [-5.0])]},
    }
    matrices, _ = aggregate.score_matrices(groups, ["Breakout-v5", "Pong-v5"], 0.1)
    assert sorted(matrices) == ["a"]
    assert "b: no run on Pong-v5: left out of the aggregate" in aggregate.DATA_NOTES
    assert "c: no final score on a game: left out of the aggregate" in aggregate.DATA_NOTES


def test_one_run_per_configuration_game_and_seed(monkeypatch, tmp_path):
    """With --unfinished, a crashed run and the new run that launch.sh started for the same seed are one seed, not two:
    the finished run is kept, else the one that got furthest; the others are left out with a note."""
    from torch.utils.tensorboard import SummaryWriter

    from sweeps import aggregate

    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    for name, seed, last_step, finished in [
        ("100", 1, 2048, False),
        ("200", 1, 3072, True),  # finished, though "400" logged a later step: kept
        ("300", 1, 1024, False),
        ("400", 1, 4096, False),
        ("100", 2, 1024, False),
        ("200", 2, 3072, False),
    ]:
        run_dir = tmp_path / f"Pong-v5__a__{seed}__{name}"
        writer = SummaryWriter(str(run_dir))
        for step in range(1024, last_step + 1, 1024):
            writer.add_scalar("charts/SPS", 500, step)
        writer.close()
        args = {"env_id": "Pong-v5", "exp_name": "a", "seed": seed, "planned_steps": 4096}
        (run_dir / "args.json").write_text(json.dumps(args))
        if finished:
            (run_dir / "done.json").write_text("{}")
    runs = aggregate.load_runs(str(tmp_path), include_unfinished=True)
    assert sorted(os.path.basename(run["dir"]) for run in runs) == ["Pong-v5__a__1__200", "Pong-v5__a__2__200"]
    assert sorted(aggregate.DATA_NOTES) == [
        "Pong-v5__a__1__100: left out: same configuration, game and seed as Pong-v5__a__1__200",
        "Pong-v5__a__1__300: left out: same configuration, game and seed as Pong-v5__a__1__200",
        "Pong-v5__a__1__400: left out: same configuration, game and seed as Pong-v5__a__1__200",
        "Pong-v5__a__2__100: left out: same configuration, game and seed as Pong-v5__a__2__200",
    ]
    assert [os.path.basename(run["dir"]) for run in aggregate.load_runs(str(tmp_path), include_unfinished=False)] == [
        "Pong-v5__a__1__200"
    ]


def test_normalise_knows_atari_procgen_and_the_rest():
    from sweeps import aggregate

    scores, what = aggregate.normalise("StarpilotEasy-v0", np.array([2.5, 33.25, 64.0]))  # Procgen easy range (2.5, 64)
    assert what == "normalised return" and scores.tolist() == pytest.approx([0.0, 0.5, 1.0])
    scores, what = aggregate.normalise("Hopper-v4", np.array([7.0]))
    assert what == "return" and scores.tolist() == [7.0]


def test_raw_returns_pooled_with_normalised_scores_are_a_data_note(monkeypatch, tmp_path):
    """Every Atari-57 game is human-normalised (Seaquest pools with Breakout silently); a task without constants pooled
    with normalised games is named in a note, which --strict turns into exit 1."""
    from sweeps import aggregate

    def notes(*games):
        runs = [fake_run(game, "ppo", seed, [100.0 * seed]) | {"total_steps": 1000} for game in games for seed in (1, 2)]
        for run in runs:
            run["args"] |= {"batch_size": 1024, "update_epochs": 4}
        monkeypatch.setattr(aggregate, "load_runs", lambda *_: runs)
        monkeypatch.setattr(aggregate, "DATA_NOTES", [])
        aggregate.report("sweep", str(tmp_path), 0.1, 2, 100, pdf=False, include_unfinished=False)
        return aggregate.DATA_NOTES

    monkeypatch.setattr(aggregate, "save", lambda figure, *_: aggregate.pyplot().close(figure))
    assert notes("Breakout-v5", "Seaquest-v5") == [] and aggregate.normalise("Seaquest-v5", np.array([68.4]))[0] == [0.0]
    message = "Hopper-v4: no normalising constants in metrics.py: its raw returns are pooled with normalised scores"
    assert notes("Breakout-v5", "Hopper-v4") == [message]


def test_a_kinetix_run_scores_its_solve_rate_not_its_return(monkeypatch, tmp_path):
    """ppo_kinetix.py's runs (args.json's script, or an env_id Kinetix-...) score charts/solve_rate, the fraction of the
    training tasks solved, as logged (no normalisation): the final score, the curves, the tables and their labels;
    pooled with another game's normalised score, a data note."""
    from scipy.stats import trim_mean

    from sweeps import aggregate

    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    monkeypatch.setattr(aggregate, "save", lambda figure, *_: aggregate.pyplot().close(figure))
    # evaluations at 2,500 ... 10,000 of 10,000 steps; the last 30 % holds the two at 7,500 and 10,000
    solve_rates = {"Kinetix-locomotion-s": lambda seed: [0.0, 0.1, 0.3, 0.4 + 0.1 * seed]}
    solve_rates["Kinetix-random-m"] = lambda seed: [0.0, 0.0, 0.1, 0.2 + 0.1 * seed]

    def write_run(env_id, seed, script, solve_rate=None):
        run_dir = tmp_path / f"{env_id}__ppo__{seed}__100"
        writer = SummaryWriter(str(run_dir))
        for step in range(1000, 10_001, 1000):
            writer.add_scalar("charts/episodic_return", 100.0 + seed, step)  # far from any solve rate
            writer.add_scalar("charts/success_rate", 0.9, step)
            writer.add_scalar("metrics/ddr", 1e4, step)
        for step, value in zip((2500, 5000, 7500, 10_000), solve_rate, strict=True) if solve_rate else ():
            writer.add_scalar("charts/solve_rate", value, step)
        writer.close()
        args = {"env_id": env_id, "exp_name": "ppo", "seed": seed, "num_envs": 64, "num_steps": 32, "schedule": None}
        args |= {"batch_size": 2048, "update_epochs": 8, "planned_steps": 10_000} | ({"script": script} if script else {})
        (run_dir / "args.json").write_text(json.dumps(args))
        (run_dir / "done.json").write_text("{}")

    for seed in (1, 2):
        write_run("Kinetix-locomotion-s", seed, "ppo_kinetix.py", solve_rates["Kinetix-locomotion-s"](seed))
        write_run("Kinetix-random-m", seed, None, solve_rates["Kinetix-random-m"](seed))  # its env_id alone says Kinetix
    finals = {(game, seed): np.mean(rates(seed)[2:]) for game, rates in solve_rates.items() for seed in (1, 2)}
    runs = {(run["env_id"], run["seed"]): run for run in aggregate.load_runs(str(tmp_path), include_unfinished=False)}
    for key, run in runs.items():
        assert aggregate.score_tag(run) == "charts/solve_rate" and aggregate.score_kind(run) == "solve rate"
        assert aggregate.final_score(run, 0.3) == pytest.approx(finals[key])
    curve = aggregate.score_curve(runs["Kinetix-locomotion-s", 2], np.array([2000, 2500, 6000, 10_000]))
    assert np.isnan(curve[0]) and curve[1:].tolist() == pytest.approx([0.0, 0.1, (0.3 + 0.6) / 2])  # evaluations' means

    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.3, 5, 100, pdf=False, include_unfinished=False)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Final solve rate = mean over the solve-rate evaluations (charts/solve_rate) in the last 30%" in text
    assert "| IQM final solve rate [95 % CI] |" in text and "optimality gap [95 % CI]" in text  # in [0, 1]: a gap below 1
    row, aggregates, per_game = (line for line in text.splitlines() if line.startswith("| ppo |"))
    scores = list(finals.values())
    assert row.startswith("| ppo | 64 | 32 | 2048 | 8 | 2 | ")
    assert float(row.split(" | ")[6].split()[0]) == pytest.approx(trim_mean(scores, 0.25), abs=1e-3)  # the IQM
    assert float(row.split(" | ")[7]) == pytest.approx(np.mean(scores), abs=1e-3)
    gap = float(aggregates.strip("| ").split(" | ")[4].split()[0])
    assert gap == pytest.approx(1 - np.mean(scores), abs=1e-3)
    assert [float(cell) for cell in per_game.strip("| ").split(" | ")[1:]] == pytest.approx(
        [np.mean(scores[:2]), np.mean(scores[2:])], abs=1e-3
    )
    assert aggregate.DATA_NOTES == []

    write_run("Breakout-v5", 1, "ppo_atari_envpool.py")  # no solve rate: its human-normalised return
    write_run("Breakout-v5", 2, "ppo_atari_envpool.py")
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.3, 5, 100, pdf=False, include_unfinished=False)
    assert "| IQM final score [95 % CI] |" in (tmp_path / "report" / "report.md").read_text()
    pooled = "a Kinetix solve rate (the fraction of its tasks solved) is pooled with other games' scores"
    assert aggregate.DATA_NOTES == [f"Kinetix-locomotion-s: {pooled}", f"Kinetix-random-m: {pooled}"]


def test_moving_average_is_trailing_over_at_most_the_window():
    from sweeps import aggregate

    assert aggregate.moving_average(np.array([1.0, 2.0, 3.0, 4.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5]


def test_report_table_mean_is_the_mean_of_the_final_scores(monkeypatch, tmp_path):
    from sweeps import aggregate

    runs = []
    for seed, final in ((1, 1.0), (2, 2.0), (3, 9.0)):  # raw returns (Hopper): mean 4, median 2
        run = {"dir": f"/runs/Hopper-v4__ppo__{seed}__100", "env_id": "Hopper-v4", "config": "ppo", "seed": seed}
        run |= {"args": {"num_envs": 8, "num_steps": 128, "batch_size": 1024, "update_epochs": 4}, "total_steps": 1000}
        run["scalars"] = {"charts/episodic_return": (np.array([950]), np.array([final]))}
        runs.append(run)
    monkeypatch.setattr(aggregate, "load_runs", lambda *_: runs)
    monkeypatch.setattr(aggregate, "save", lambda figure, *_: aggregate.pyplot().close(figure))
    monkeypatch.setattr(aggregate, "DATA_NOTES", [])  # not the notes of the tests before it
    aggregate.report("sweep", str(tmp_path), 0.1, 10, 100, pdf=False, include_unfinished=False)
    assert "## Data left out" not in (tmp_path / "report.md").read_text()
    row, aggregates, _ = (line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("| ppo |"))
    assert row.split(" | ")[-2] == "4.000"  # the mean column
    # rliable's table for raw returns: median, IQM, mean of one game's 1, 2, 9 (the median over games of its mean: 4); no gap
    assert [cell.split()[0] for cell in aggregates.strip("| ").split(" | ")[1:]] == ["4.000", "4.000", "4.000"]
    assert "median [95 % CI] | IQM [95 % CI] | mean [95 % CI] |\n" in (tmp_path / "report.md").read_text()
    assert "![performance_profiles.png]" in (tmp_path / "report.md").read_text()  # one game: one scale
    runs += [run | {"env_id": "Walker2d-v4", "dir": run["dir"].replace("Hopper", "Walker2d")} for run in runs]
    aggregate.report("sweep", str(tmp_path), 0.1, 10, 100, pdf=False, include_unfinished=False)
    assert "performance_profiles" not in (tmp_path / "report.md").read_text()  # raw returns of two games: no shared scale
    runs.append(runs[0] | {"config": "short", "dir": "/runs/Hopper-v4__short__1__100"})  # one game of two: left out
    aggregate.report("sweep", str(tmp_path), 0.1, 10, 100, pdf=False, include_unfinished=False, baseline="short")
    text = (tmp_path / "report.md").read_text()
    assert "- short: --baseline is left out of the aggregate (above): no probability of improvement" in text
    assert "Probability of improvement" not in text and "- short: no run on Walker2d-v4: left out of the aggregate" in text


def test_learning_dynamics_get_a_figure_a_game_with_its_score_beside_the_metrics(monkeypatch, tmp_path):
    """The paper's Fig. 3 and 10 show each game's metrics beside its returns: with several games the report draws one
    figure a game (its score first, its runs' metric values alone) besides the figure that pools the games."""
    from sweeps import aggregate

    runs = []
    for game, offset in (("Breakout-v5", 10.0), ("Pong-v5", 30.0)):
        for seed in (1, 2):
            run = fake_run(game, "ppo", seed, [float(seed)]) | {"total_steps": 1000}
            run["args"] |= {"batch_size": 1024, "update_epochs": 4}
            run["scalars"]["metrics/weight_norm"] = (np.array([500, 1000]), np.full(2, offset + seed))
            runs.append(run)
    panels = {}  # per figure: each panel's title and the data of its lines (the figure itself is closed)

    def save(figure, path, pdf):
        panels[os.path.basename(path)] = [
            (axis.get_title(), [list(line.get_ydata()) for line in axis.lines]) for axis in figure.axes
        ]
        aggregate.pyplot().close(figure)

    monkeypatch.setattr(aggregate, "load_runs", lambda *_: runs)
    monkeypatch.setattr(aggregate, "save", save)
    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    aggregate.report("sweep", str(tmp_path), 0.1, 2, 100, pdf=False, include_unfinished=False)
    assert "![metric_curves_Pong-v5.png](metric_curves_Pong-v5.png)" in (tmp_path / "report.md").read_text()
    assert panels["metric_curves.png"][0] == ("weight norm", [[21.5, 21.5]])  # 11, 12, 31, 32: every game's runs
    pong_score = metrics.human_normalized_score("Pong-v5", np.array([1.5]))[0]  # seeds 1 and 2 score 1 and 2 at step 950
    assert panels["metric_curves_Pong-v5.png"][:2] == [
        ("human-normalised score", [[pytest.approx(np.nan, nan_ok=True), pytest.approx(pong_score)]]),
        ("weight norm", [[31.5, 31.5]]),  # Pong's runs alone
    ]
    assert panels["metric_curves_Breakout-v5.png"][1] == ("weight norm", [[11.5, 11.5]])


def test_launcher_rejects_a_commands_file_that_is_missing_or_a_directory(tmp_path):
    for path in (tmp_path / "missing.txt", tmp_path):
        env = {**os.environ, "LAUNCHER": "print", "LOG_DIR": str(tmp_path / "logs")}
        result = subprocess.run(["bash", LAUNCH, str(path)], capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 2 and result.stdout == "" and "is not a readable file" in result.stderr, result.stderr
