"""Faults a user meets, each driven through the real tool: damaged or missing data in sweeps/aggregate.py; a full disk,
colliding run directories and a killed run in the training scripts."""

import contextlib
import errno
import glob
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    TOO_BIG_PHASE,
    only_run_dir,
    read_scalars,
    run_main,
    run_script,
    run_torchrun,
    usage_error,
    wrap_envpool_steps,
)
from torch.utils.tensorboard import SummaryWriter

AGGREGATE = os.path.join(ROOT, "sweeps", "aggregate.py")


def fake_run(sweep_dir, seed: int, episode_steps: list[int] | None, cut_events: bool = False) -> str:
    """A finished run directory of 1000 steps with episodes (return = step / 100) at `episode_steps`; None: no events."""
    run_dir = os.path.join(sweep_dir, f"Breakout-v5__ppo__{seed}__1")
    os.makedirs(run_dir)
    args = {
        "env_id": "Breakout-v5",
        "exp_name": "ppo",
        "seed": seed,
        "planned_steps": 1000,
        "num_iterations": 10,
        "batch_size": 100,
        "num_envs": 4,
        "num_steps": 25,
        "update_epochs": 4,
        "schedule": None,
    }
    json.dump(args, open(os.path.join(run_dir, "args.json"), "w"))
    json.dump({"global_step": 1000, "iterations": 10}, open(os.path.join(run_dir, "done.json"), "w"))
    if episode_steps is not None:
        writer = SummaryWriter(run_dir)
        for step in episode_steps:
            writer.add_scalar("charts/episodic_return", step / 100, step)
        writer.close()
    if cut_events:
        (path,) = [os.path.join(run_dir, name) for name in os.listdir(run_dir) if name.startswith("events.out")]
        os.truncate(path, os.path.getsize(path) // 2)
    return os.path.basename(run_dir)


def run_aggregate(monkeypatch, capsys, *argv) -> tuple[int, str]:
    """sweeps/aggregate.py's main() in-process (matplotlib, rliable and torch imported once, not per command): its exit
    status and stderr. A warning that a process would print (Python's default filters) fails the test."""
    from sweeps import aggregate

    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    monkeypatch.setattr(sys, "argv", [AGGREGATE, *map(str, argv)])
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.filterwarnings("ignore", category=hidden)
        try:
            aggregate.main()
            status = 0
        except SystemExit as stop:
            status = stop.code or 0
    assert not caught, [f"{w.category.__name__}: {w.message}" for w in caught]
    return status, capsys.readouterr().err


def test_aggregate_reports_every_datum_it_drops_or_substitutes_and_strict_fails(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    every_50 = list(range(50, 1001, 50))
    good = fake_run(sweep, 1, every_50)
    damaged = fake_run(sweep, 2, every_50, cut_events=True)
    without_events = fake_run(sweep, 3, None)
    early_only = fake_run(sweep, 4, [100, 200, 300])
    broken = fake_run(sweep, 5, every_50)
    (sweep / broken / "args.json").write_text('{"env_id": ')  # one unreadable args.json: that run out, not the report
    command = ["report", sweep, "--reps", "10", "--points", "2"]

    status, stderr = run_aggregate(monkeypatch, capsys, *command)  # no library's warning either (numpy's mean of no run)
    assert status == 0, stderr
    notes = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    expected = [
        f"{damaged}: events.out.tfevents",
        f"{without_events}: no TensorBoard event file",
        f"{early_only}: no episode ended in the last 10% of the steps: its last 10 episodes score",
        f"{damaged}: no episode ended in the last 10% of the steps",  # the episodes after the cut are lost
        f"{without_events}: no episode ended with a finite return: no final score (left out of the aggregate)",
        f"{broken}: args.json unreadable (JSONDecodeError: ",
    ]
    for fragment in expected:
        assert sum(fragment in line for line in notes) == 1, (fragment, notes)
    assert len(notes) == 6 and not any(good in line for line in notes) and stderr.count("\n") == 6  # only the notes
    report = (sweep / "report" / "report.md").read_text()
    listed = report.split("## Data left out or substituted")[1].strip().splitlines()
    assert listed == [f"- {line.removeprefix('warning: ')}" for line in notes]

    status, stderr = run_aggregate(monkeypatch, capsys, *command, "--strict")
    assert status == 1 and stderr.strip().splitlines()[-1].startswith("error: --strict: 6 datum(s)")
    status, stderr = run_aggregate(monkeypatch, capsys, "curves", sweep / good, "--out", tmp_path / "c.png", "--strict")
    assert status == 0 and "warning" not in stderr, stderr


def flip_bit_of_return(run_dir, step: int, old: bytes, new: bytes) -> tuple[str, int]:
    """Change the float of the charts/episodic_return record at `step` from `old` to `new` (4 bytes, one bit apart),
    leaving its CRCs as they were: the event file and the record's byte offset."""
    from tensorboard.compat.proto.event_pb2 import Event

    (path,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    data, position = bytearray(open(path, "rb").read()), 0
    while position < len(data):
        length = int.from_bytes(data[position : position + 8], "little")
        payload = bytes(data[position + 12 : position + 12 + length])
        if Event.FromString(payload).step == step:
            field = payload.index(b"\x15" + old)  # simple_value: field 2, a fixed32
            assert bin(int.from_bytes(old, "little") ^ int.from_bytes(new, "little")).count("1") == 1
            data[position + 12 + field + 1 : position + 12 + field + 5] = new
            assert Event.FromString(bytes(data[position + 12 : position + 12 + length])).summary.value[0].simple_value != 0
            open(path, "wb").write(data)
            return os.path.basename(path), position
        position += 16 + length
    raise AssertionError(f"no record at step {step}")


def test_aggregate_drops_a_record_with_a_flipped_bit_names_its_file_and_strict_fails(tmp_path, monkeypatch, capsys):
    """One flipped bit turned an episodic return of 0.0 into 2.0, read without a word: the record's CRC says it is
    damaged. It is dropped (the other points stay), a data note names the run and the file, --strict exits 1."""
    from sweeps import aggregate

    sweep = tmp_path / "sweep"
    fake_run(sweep, 1, list(range(50, 1001, 50)))
    damaged = fake_run(sweep, 2, None)
    writer = SummaryWriter(str(sweep / damaged))
    for step in range(50, 1001, 50):
        writer.add_scalar("charts/episodic_return", 0.0, step)
    writer.close()
    file, byte = flip_bit_of_return(sweep / damaged, 950, b"\0\0\0\0", b"\0\0\0\x40")  # 0.0 -> 2.0
    note = f"{damaged}: {file}: the record at byte {byte:,} is damaged (CRC mismatch): dropped"

    aggregate.DATA_NOTES.clear()
    steps, returns = aggregate.read_scalars(str(sweep / damaged))["charts/episodic_return"]
    assert steps.tolist() == [step for step in range(50, 1001, 50) if step != 950] and not returns.any()
    assert aggregate.DATA_NOTES == [note]
    aggregate.DATA_NOTES.clear()

    command = ["report", sweep, "--reps", "10", "--points", "2"]
    status, stderr = run_aggregate(monkeypatch, capsys, *command)
    assert status == 0 and stderr.splitlines() == [f"warning: {note}"], stderr
    assert f"- {note}" in (sweep / "report" / "report.md").read_text()
    status, stderr = run_aggregate(monkeypatch, capsys, *command, "--strict")
    assert status == 1 and stderr.strip().splitlines()[-1].startswith("error: --strict: 1 datum(s)")


def test_aggregate_stops_reading_an_event_file_at_a_damaged_length(tmp_path):
    """A flipped bit in a record's length (its own CRC fails): where the next record starts is lost, so the file is read
    up to that record, with a note; a bit flipped in a data CRC drops that one record."""
    from sweeps import aggregate

    run = fake_run(tmp_path, 1, list(range(50, 1001, 50)))
    (path,) = glob.glob(os.path.join(tmp_path, run, "events.out.tfevents.*"))
    data, heads, position = bytearray(open(path, "rb").read()), [], 0
    while position < len(data):
        heads.append(position)
        position += 16 + int.from_bytes(data[position : position + 8], "little")
    assert len(heads) == 21  # the file version, then the 20 returns
    data[heads[5] + 12 + int.from_bytes(data[heads[5] : heads[5] + 8], "little") + 2] ^= 0x10  # the 5th return's data CRC
    data[heads[15]] ^= 0x01  # the 15th return's length
    open(path, "wb").write(data)
    aggregate.DATA_NOTES.clear()
    steps, _ = aggregate.read_scalars(os.path.join(tmp_path, run))["charts/episodic_return"]
    assert steps.tolist() == [step for step in range(50, 701, 50) if step != 250]
    file = os.path.basename(path)
    assert aggregate.DATA_NOTES == [
        f"{run}: {file}: the record at byte {heads[5]:,} is damaged (CRC mismatch): dropped",
        f"{run}: {file} is damaged (cut short or unreadable from byte {heads[15]:,}): only the events before it are read",
    ]
    aggregate.DATA_NOTES.clear()


def test_aggregate_crc32c_is_tensorboards_masked_crc32c():
    """The vectorised CRC32C of aggregate.py against TensorBoard's own (pure Python, one record at a time), on lengths
    around the table loop's edges and over LONG_RECORD (checked in Python)."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from sweeps import aggregate

    rng = np.random.default_rng(0)
    lengths = [0, 1, 2, 3, 8, 9, 31, 72, 1000, aggregate.LONG_RECORD, aggregate.LONG_RECORD + 1, 9000, 5, 0]
    records = [rng.integers(0, 256, length, dtype=np.uint8).tobytes() for length in lengths]
    starts = np.cumsum([0, *lengths[:-1]])
    crcs = aggregate.masked_crc32c(np.frombuffer(b"".join(records), dtype=np.uint8), starts, np.array(lengths))
    assert crcs.dtype == np.uint32 and crcs.tolist() == [masked_crc32c(record) for record in records]
    check = 0xE3069283  # CRC32C's check value: the CRC of b"123456789" (RFC 3720, iSCSI), masked as TFRecord masks it
    nine = aggregate.masked_crc32c(np.frombuffer(b"123456789", dtype=np.uint8), np.array([0]), np.array([9]))
    assert nine.tolist() == [(((check >> 15) | (check << 17)) + 0xA282EAD8) & 0xFFFFFFFF]


# ---- The training scripts' plumbing, through ppo_atari_envpool.py (the other scripts hold checked copies of it) ----
SCRIPT = "ppo_atari_envpool.py"
TINY = [
    "--no-cuda",
    "--num-envs",
    "2",
    "--num-steps",
    "16",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "1",
    "--max-episode-steps",
    "40",
    "--metrics-interval",
    "0",
    "--torch-threads",
    "1",
]


@contextlib.contextmanager
def small_disk(path, megabytes: int):
    """A real file system of `megabytes` at `path`: a tmpfs when running as root (CI's container), else skipped."""
    os.makedirs(path)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", path]).returncode:
        pytest.skip("mounting a small tmpfs needs root (see test_a_failed_write_... for the injected OSError)")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], check=True)


def test_a_disk_full_mid_run_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path):
    """A checkpoint (Nature CNN and Adam: about 20 MB) fits on a 32 MB disk once; the second needs its temporary file
    beside the first and does not fit. The run stops with one line, exit 1, and the first checkpoint still resumes."""
    with small_disk(str(tmp_path / "disk"), 32) as disk:
        result = run_script(SCRIPT, *TINY, "--total-timesteps", "256", "--checkpoint-interval", "2", "--runs-dir", disk)
        assert result.returncode == 1, result.stderr
        run_dir = only_run_dir(disk)
        lines = result.stderr.strip().splitlines()
        assert lines == [
            f"error: cannot write {run_dir}/checkpoint.pt: No space left on device; the last checkpoint is "
            f"intact: free space, then --resume {run_dir}/checkpoint.pt"
        ], lines
        assert sorted(os.listdir(run_dir))[:2] == ["args.json", "checkpoint.pt"] and not glob.glob(f"{run_dir}/*.tmp*")
        checkpoint = torch.load(f"{run_dir}/checkpoint.pt", weights_only=True)
        assert (checkpoint["iteration"], checkpoint["global_step"]) == (2, 64)
        shutil.copytree(run_dir, tmp_path / "moved")  # somewhere with space: the checkpoint resumes to the end
    resumed = run_script(SCRIPT, "--resume", str(tmp_path / "moved" / "checkpoint.pt"), "--no-cuda")
    assert resumed.returncode == 0, resumed.stderr
    assert json.load(open(tmp_path / "moved" / "done.json")) == {"global_step": 256, "iterations": 8}


def test_a_disk_full_at_process_0_under_torchrun_ends_the_other_without_a_traceback(tmp_path):
    """Process 0 alone writes the run: when a full disk stops it, the other process meets its end in a collective and
    leaves with one line that names the checkpoint (not with Gloo's traceback)."""
    with small_disk(str(tmp_path / "disk"), 32) as disk:
        result = run_torchrun(SCRIPT, 2, *TINY, "--total-timesteps", "256", "--checkpoint-interval", "2", "--runs-dir", disk)
    errors = sorted(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert result.returncode != 0 and len(errors) == 2 and "No space left on device" in errors[1], result.stderr
    assert errors[0].startswith("error: another torchrun process has ended") and "--resume" in errors[0], result.stderr
    assert "[rank1]" not in result.stderr and "exitcode: -6" not in result.stderr, result.stderr


def test_a_full_disk_at_start_leaves_no_half_written_file(tmp_path):
    with small_disk(str(tmp_path / "disk"), 1) as disk:
        with open(os.path.join(disk, "filler"), "wb") as f:  # fill the disk
            with contextlib.suppress(OSError):
                f.write(b"\0" * 2**21)
        result = run_script(SCRIPT, *TINY, "--total-timesteps", "64", "--runs-dir", disk)
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("error: cannot write ") and "args.json: No space left on device" in result.stderr
        run_dir = only_run_dir(disk)
        assert os.listdir(run_dir) == []  # neither args.json nor its temporary file


def test_a_disk_that_fills_up_under_the_event_file_stops_the_run_with_one_line(tmp_path):
    """TensorBoard writes in a thread of its own, whose OSError names no file: one line (not also the thread's
    traceback) that says which file, exit 1."""
    with small_disk(str(tmp_path / "disk"), 1) as disk:
        with open(os.path.join(disk, "filler"), "wb") as f:  # leave 24 KB: args.json fits, the events soon do not
            f.write(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - 24 * 1024))
        result = run_script(SCRIPT, *TINY, "--total-timesteps", "6400", "--runs-dir", disk)
    assert result.returncode == 1 and result.stderr == (
        "error: cannot write the event file: No space left on device\n"  # no checkpoint to resume: none is named
    )


def test_a_signal_once_the_run_has_finished_leaves_its_exit_status_0(tmp_path):
    """Slurm's SIGTERM may land while Python shuts down after done.json, where Python has put back the default handler
    (exit 143, no message: launch.sh listed the finished run as failed)."""
    command = [sys.executable, SCRIPT, *TINY, "--total-timesteps", "64", "--runs-dir", str(tmp_path)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not glob.glob(os.path.join(tmp_path, "*", "done.json")):
        assert time.time() < deadline and process.poll() is None, process.stderr.read()
        time.sleep(0.01)
    while process.poll() is None:  # again and again until it has exited: one of them lands while Python shuts down
        process.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    assert process.wait() == 0 and process.stderr.read() == ""


def test_a_run_is_trained_by_one_process_at_a_time(tmp_path):
    """A script holds its run's lock file while it trains, released however it exits (sweeps/launch.sh skips a run
    whose lock is held): a --resume of a run that another process trains (a second launcher on the same RUNS_DIR)
    exits 2 before it touches the run; it purged the other's TensorBoard points and ended its done.json early."""
    import fcntl

    def locked(path):  # by another process (a POSIX lock, as the scripts take)
        try:
            with open(path, "a") as lock:
                fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            return True
        return False

    command = [sys.executable, SCRIPT, *TINY, "--total-timesteps", "100000", "--runs-dir", str(tmp_path)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not any(locked(path) for path in glob.glob(os.path.join(tmp_path, "*", "lock"))):
        assert time.time() < deadline and process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=300) == 128 + signal.SIGTERM, process.stderr.read()
    run_dir = only_run_dir(tmp_path)
    assert not locked(os.path.join(run_dir, "lock"))  # released by the exit
    with open(os.path.join(run_dir, "lock"), "a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)  # another process trains the run
        files = sorted(os.listdir(run_dir))
        second = run_script(SCRIPT, "--resume", os.path.join(run_dir, "checkpoint.pt"), "--no-cuda")
        assert second.returncode == 2, second.stderr
        assert second.stderr == f"error: {run_dir} is being trained by another process (it holds the run's lock file)\n"
        assert sorted(os.listdir(run_dir)) == files  # no new event file


def test_track_without_a_weights_and_biases_login_exits_2_with_one_line(tmp_path):
    env = {"WANDB_MODE": "online", "WANDB_API_KEY": "", "HOME": str(tmp_path)}  # no key in the environment or ~/.netrc
    result = run_script(SCRIPT, *TINY, "--total-timesteps", "32", "--track", "--runs-dir", str(tmp_path / "runs"), env=env)
    assert result.returncode == 2 and result.stderr.startswith("error: --track: Weights & Biases did not start (")
    assert result.stderr.count("\n") == 1, result.stderr


def test_a_failed_write_names_the_file_removes_the_temporary_file_and_keeps_the_old_one(tmp_path, monkeypatch, capsys):
    """The same path with an injected OSError (no root needed): write_atomically and stop_on_write_error."""
    import ppo_atari_envpool

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"the last good checkpoint")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError) as raised:
        ppo_atari_envpool.write_atomically(str(path), b"a newer checkpoint")
    assert raised.value.filename == str(path) and os.listdir(tmp_path) == ["checkpoint.pt"]
    assert path.read_bytes() == b"the last good checkpoint"
    with pytest.raises(SystemExit) as exited:
        ppo_atari_envpool.stop_on_write_error(raised.value)
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        f"error: cannot write {path}: No space left on device; the last checkpoint is "
        f"intact: free space, then --resume {path}\n"
    )


def test_a_phase_that_does_not_fit_in_memory_ends_the_run_with_one_line_after_a_checkpoint(tmp_path, capsys, monkeypatch):
    """A --schedule phase too big for memory ends the run with one line, exit 1, and the checkpoint written as the phase
    before it ended holds the work so far (the line names it: resumable where more memory is free); CUDA's, numpy's,
    Warp's and EnvPool's errors give the same line, another error passes through. PPO as 2 torchrun processes (each
    fails to allocate its half; process 0 has told the other the run directory, so either's line names the checkpoint;
    the one to fail first may end the other before its line), PPO-EWMA and PQN in-process."""
    result = run_torchrun("ppo_atari_envpool.py", 2, *TOO_BIG_PHASE, "--runs-dir", str(tmp_path / "ppo"))
    assert result.returncode == 1 and 'ppo_atari_envpool.py", line' not in result.stderr, result.stderr  # no traceback
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    checkpoint = os.path.join(only_run_dir(tmp_path / "ppo"), "checkpoint.pt")
    assert len(errors) in (1, 2) and set(errors) == {
        "error: out of host memory (tried to allocate 105,142.6 GiB): try a smaller batch or minibatch; "
        f"or --resume {checkpoint} with more memory free"
    }, result.stderr
    for script in ("ppo_ewma_atari", "pqn_atari"):  # the error itself, before __main__ turns it into the line above
        with pytest.raises(RuntimeError, match="allocate"):
            run_main(monkeypatch, importlib.import_module(script), [*TOO_BIG_PHASE, "--runs-dir", str(tmp_path / script)])
    for runs in ("ppo", "ppo_ewma_atari", "pqn_atari"):
        run_dir = only_run_dir(tmp_path / runs)
        checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
        assert (checkpoint["iteration"], checkpoint["global_step"]) == (2, 64), runs
        assert not os.path.exists(os.path.join(run_dir, "done.json"))
    import ppo_atari_envpool

    os.remove(os.path.join(only_run_dir(tmp_path / "ppo_ewma_atari"), "checkpoint.pt"))  # a run without a checkpoint
    monkeypatch.setattr(ppo_atari_envpool, "RUN_DIR", only_run_dir(tmp_path / "ppo_ewma_atari"))
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB")
    numpy = MemoryError("Unable to allocate 29.8 GiB for an array with shape (1000000000, 8) and data type float32")
    for error, expected in (
        (cuda, "out of GPU memory (tried to allocate 20.00 GiB)"),
        (numpy, "out of host memory (tried to allocate 29.8 GiB)"),
        (MemoryError("std::bad_alloc"), "out of host memory (std::bad_alloc)"),  # EnvPool's, e.g. --num-envs 100000
        (
            RuntimeError("Failed to allocate 4294967296 bytes on device 'cuda:0'"),
            "out of GPU memory (tried to allocate 4.0 GiB)",
        ),
        (MemoryError(), "out of host memory (MemoryError)"),
    ):
        with pytest.raises(SystemExit) as exited:
            ppo_atari_envpool.stop_if_out_of_memory(error)
        assert exited.value.code == 1 and capsys.readouterr().err == f"error: {expected}: try a smaller batch or minibatch\n"
    assert ppo_atari_envpool.stop_if_out_of_memory(RuntimeError("Connection closed by peer")) is None


def test_embeddings_are_saved_before_the_checkpoint_and_a_resumed_run_replaces_the_iterations_it_trains_again(
    tmp_path, monkeypatch
):
    """A checkpoint that cannot be written leaves the embeddings saved (the old order lost them for good); the resumed
    run, which trains those iterations again, replaces their rows instead of adding them twice."""
    import ppo_atari_envpool

    def chunk(iteration):
        return {"features": np.full((2, 3), iteration, np.float16), "iteration": np.full(2, iteration)}

    args = ppo_atari_envpool.Args()
    ppo_atari_envpool.save_checkpoint(str(tmp_path), args, {}, [chunk(2), chunk(4)])
    failing = ppo_atari_envpool.write_atomically
    monkeypatch.setattr(  # the disk fills up at the checkpoint
        ppo_atari_envpool,
        "write_atomically",
        lambda path, data: failing(path, data) if path.endswith(".npz") else (_ for _ in ()).throw(OSError(errno.ENOSPC, "")),
    )
    with pytest.raises(OSError):
        ppo_atari_envpool.save_checkpoint(str(tmp_path), args, {}, [chunk(6), chunk(8)], model=torch.nn.Linear(1, 1))
    assert np.load(tmp_path / "embeddings.npz")["iteration"].tolist() == [2, 2, 4, 4, 6, 6, 8, 8]
    ppo_atari_envpool.save_checkpoint(str(tmp_path), args, {}, [chunk(6)])  # resumed from the checkpoint of iteration 4
    saved = np.load(tmp_path / "embeddings.npz")
    assert saved["iteration"].tolist() == [2, 2, 4, 4, 6, 6] and saved["features"][:, 0].tolist() == [2, 2, 4, 4, 6, 6]


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path):
    """Every name the runs could take in the next hour already exists (as if taken by runs started in that second):
    two runs started together each create their own directory, with a suffix, and write only there."""
    now = int(time.time())
    for second in range(now - 5, now + 3600):  # however slow the start on a loaded machine
        os.makedirs(tmp_path / f"Breakout-v5__ppo_atari_envpool__1__{second}")
    command = [sys.executable, os.path.join(ROOT, SCRIPT), *TINY, "--total-timesteps", "64", "--runs-dir", str(tmp_path)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    processes = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in "ab"]
    assert [process.wait(timeout=600) for process in processes] == [0, 0]
    finished = sorted(os.path.dirname(path) for path in glob.glob(str(tmp_path / "*" / "done.json")))
    assert len(finished) == 2 and all(re.search(r"__1__\d+_\d+$", run_dir) for run_dir in finished), finished
    for run_dir in finished:
        assert len(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))) == 1
        assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [32, 64]


def test_a_run_killed_after_an_unsaved_iteration_resumes_with_one_point_per_step(tmp_path):
    """SIGKILL after the run logged iterations past its last checkpoint: the resumed run logs those steps again, and
    TensorBoard's purge_step hides the first copies, so each tag reads back with every step once."""
    flags = [*TINY, "--total-timesteps", "640", "--checkpoint-interval", "3", "--runs-dir", str(tmp_path)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen([sys.executable, SCRIPT, *flags], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def logged_past_checkpoint() -> bool:
        run_dirs = glob.glob(str(tmp_path / "*"))
        if not run_dirs or not os.path.exists(checkpoint_path := os.path.join(run_dirs[0], "checkpoint.pt")):
            return False
        saved_step = torch.load(checkpoint_path, weights_only=True)["global_step"]
        events = EventAccumulator(run_dirs[0])
        events.Reload()
        logged = [event.step for event in events.Scalars("charts/SPS")] if "charts/SPS" in events.Tags()["scalars"] else []
        return any(step > saved_step for step in logged)

    killed_past_checkpoint = False
    while not killed_past_checkpoint and process.poll() is None:
        time.sleep(0.2)
        if logged_past_checkpoint():
            process.send_signal(signal.SIGSTOP)  # nothing more is written: look again, as the kill will leave the files
            killed_past_checkpoint = logged_past_checkpoint()
            process.send_signal(signal.SIGKILL if killed_past_checkpoint else signal.SIGCONT)
    process.kill()
    process.wait()
    assert killed_past_checkpoint, "the run ended before it logged past a checkpoint"
    run_dir = only_run_dir(tmp_path)
    result = run_script(SCRIPT, "--resume", os.path.join(run_dir, "checkpoint.pt"), "--no-cuda", "--torch-threads", "1")
    assert result.returncode == 0, result.stderr
    scalars = read_scalars(run_dir)
    assert [step for step, _ in scalars["charts/SPS"]] == list(range(32, 641, 32))
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # aggregate.py reads what TensorBoard shows
    events.Reload()
    shown = {
        tag: sorted([(e.step, e.value) for e in events.Scalars(tag)], key=lambda p: p[0]) for tag in events.Tags()["scalars"]
    }
    assert shown == scalars
    for tag in ("losses/policy_loss", "charts/learning_rate", "charts/episodic_return"):
        steps = [step for step, _ in scalars[tag]]
        assert steps == sorted(steps) and (tag == "charts/episodic_return" or len(set(steps)) == len(steps) == 20), tag


def test_a_nan_reward_stops_the_run_with_one_line_before_a_checkpoint_keeps_it(tmp_path, monkeypatch, capsys):
    """EnvPool hands back a NaN reward on the 6th step of iteration 4: the run stops after that iteration's update with
    one line (exit 1), and the checkpoint of iteration 2 stays the last one, with finite weights."""
    import numpy as np

    import ppo_atari_envpool

    steps = []

    def nan_once(obs, reward, terminated, truncated, info):
        steps.append(None)
        if len(steps) == 3 * 16 + 6:
            reward = np.where(np.arange(len(reward)) == 1, np.nan, reward)
        return obs, reward, terminated, truncated, info

    wrap_envpool_steps(ppo_atari_envpool, monkeypatch, nan_once)
    flags = [*TINY, "--total-timesteps", "256", "--checkpoint-interval", "2", "--runs-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [SCRIPT, *flags])
    with pytest.raises(SystemExit) as exited:
        ppo_atari_envpool.main()
    assert exited.value.code == 1
    run_dir = only_run_dir(tmp_path)
    assert capsys.readouterr().err.splitlines() == [
        "error: non-finite rewards, losses_or_gradients at iteration 4 (global step 128); the last checkpoint is "
        f"unchanged: {run_dir}/checkpoint.pt"
    ]
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert checkpoint["iteration"] == 2 and all(weights.isfinite().all() for weights in checkpoint["model"].values())


def test_a_nan_observation_from_the_simulator_stops_the_continuous_run_before_a_checkpoint_keeps_it(
    tmp_path, monkeypatch, capsys
):
    """ppo_isaacgym.py on EnvPool's Ant: one NaN in an observation in iteration 3 stops the run after that
    iteration's update (its normaliser and weights are no longer finite) with one line; the last checkpoint stays."""
    import continuous_tasks
    import ppo_isaacgym

    step, steps = continuous_tasks.EnvPoolTasks.step, []

    def nan_once(self, actions):
        obs, reward, terminated, truncated = step(self, actions)
        steps.append(None)
        if len(steps) == 2 * 8 + 3:
            obs[0, 5] = float("nan")
        return obs, reward, terminated, truncated

    monkeypatch.setattr(continuous_tasks.EnvPoolTasks, "step", nan_once)
    flags = ["--backend", "envpool", "--env-id", "Ant-v5", "--no-cuda", "--num-envs", "4", "--num-steps", "8"]
    flags += ["--total-timesteps", "160", "--metrics-interval", "0", "--checkpoint-interval", "1", "--runs-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["ppo_isaacgym.py", *flags])
    with pytest.raises(SystemExit) as exited:
        ppo_isaacgym.main()
    assert exited.value.code == 1
    run_dir = only_run_dir(tmp_path)
    assert capsys.readouterr().err.splitlines() == [
        "error: non-finite observations, rewards, losses_or_gradients at iteration 3 (global step 96); the last checkpoint is "
        f"unchanged: {run_dir}/checkpoint.pt"
    ]
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert checkpoint["iteration"] == 2 and all(tensor.isfinite().all() for tensor in checkpoint["obs_rms"].values())


def test_envs_that_do_not_fit_in_memory_exit_2_with_one_line(tmp_path, monkeypatch, capsys):
    import ppo_isaacgym

    def out_of_memory(*_):
        raise MemoryError("Unable to allocate 9.2 GiB for an array")  # numpy's, from mujoco_warp.make_data

    monkeypatch.setattr(ppo_isaacgym, "make_tasks", out_of_memory)
    flags = ["--backend", "envpool", "--env-id", "Ant-v5", "--no-cuda", "--num-envs", "262144", "--runs-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exited:
        run_main(monkeypatch, ppo_isaacgym, flags)
    assert exited.value.code == 2
    assert capsys.readouterr().err == "error: --num-envs 262144: the simulator's state does not fit in the CPU's memory\n"


@pytest.mark.parametrize("script", ["ppo_atari_envpool", "ppo_ewma_atari", "ppo_procgen", "ppo_isaacgym"])
def test_a_metrics_batch_smaller_than_the_torchrun_processes_exits_2_with_one_line(monkeypatch, capsys, script):
    """Each process samples its share of --metrics-batch: a share of 0 states would end in a traceback in the metrics."""
    module = importlib.import_module(script)
    monkeypatch.setattr(module, "WORLD_SIZE", 2)
    with pytest.raises(SystemExit) as stop:
        module.validate_and_derive(module.Args(metrics_batch=1, cuda=False))
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: --metrics-batch 1 leaves some of the 2 processes no state to measure\n"


def test_a_torchrun_process_killed_leaves_the_other_one_line_that_names_the_checkpoint(tmp_path):
    """A real SIGKILL of one worker after the first checkpoint: Gloo tells the survivor "Connection reset by peer" (or
    "closed by peer", a read or write error); it ends with one line naming the checkpoint, exit 1, no traceback."""
    flags = ["--num-envs", "4", "--num-steps", "32", "--total-timesteps", "4096", "--no-cuda", "--torch-threads", "1"]
    flags += ["--checkpoint-interval", "2", "--runs-dir", str(tmp_path / "runs")]
    logs = ["--log-dir", str(tmp_path / "logs"), "--redirects", "3"]  # each worker's stdout and stderr in a file
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *logs]
    process = subprocess.Popen(
        [*launcher, SCRIPT, *flags], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 300
    while not glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt")):
        assert time.time() < deadline and process.poll() is None, "no checkpoint"
        time.sleep(0.1)

    def environment(pid):  # of a worker that torchrun started, else []
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat") as stat:
            if int(stat.read().rsplit(")", 1)[1].split()[1]) == process.pid:
                return open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        return []

    rank_1 = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and b"RANK=1" in environment(pid)]
    assert len(rank_1) == 1, rank_1
    os.kill(rank_1[0], signal.SIGKILL)
    launcher_errors = process.communicate(timeout=300)[1].decode()
    assert "exitcode  : 1 " in launcher_errors and "exitcode  : -9 " in launcher_errors, launcher_errors  # the survivor's
    survivor = open(glob.glob(str(tmp_path / "logs" / "*" / "attempt_0" / "0" / "stderr.log"))[0]).read()
    checkpoint = os.path.join(only_run_dir(tmp_path / "runs"), "checkpoint.pt")
    assert "Traceback" not in survivor, survivor
    assert re.fullmatch(
        rf"error: another torchrun process has ended \([^)]+\); continue with --resume {re.escape(checkpoint)}\n", survivor
    )


def crafted_checkpoint(run_dir, changes):
    """A checkpoint of ppo_atari_envpool.py in `run_dir` (a run directory: args.json and its lock) with `changes` to its
    entries, "args.NAME" and "model.NAME" to one of its flags or weights (None: left out)."""
    import dataclasses

    import ppo_atari_envpool

    args = ppo_atari_envpool.validate_and_derive(ppo_atari_envpool.Args(num_envs=4, num_steps=16, env_id="Pong-v5"))
    agent = ppo_atari_envpool.Agent(6, separate_networks=False)
    checkpoint = {"args": dataclasses.asdict(args), "model": agent.state_dict()}
    checkpoint |= {"optimizer": torch.optim.Adam(agent.parameters()).state_dict(), "iteration": 1, "global_step": 64}
    checkpoint |= {"rng": {"torch": torch.get_rng_state(), "cuda": []}}
    for key, value in changes.items():
        entries, name = (checkpoint[key.split(".")[0]], key.split(".", 1)[1]) if "." in key else (checkpoint, key)
        entries.pop(name) if value is None else entries.__setitem__(name, value)
    os.makedirs(run_dir)
    for name in ("args.json", "lock"):
        open(os.path.join(run_dir, name), "w").close()
    torch.save(checkpoint, os.path.join(run_dir, "checkpoint.pt"))
    return os.path.join(run_dir, "checkpoint.pt")


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"args.num_envs": "four"}, "does not fit ppo_atari_envpool.py: num_envs='four'"),
        ({"args.learning_rate": True, "args.lr_scaling": "cubic"}, "learning_rate=True, lr_scaling='cubic'"),
        ({"args.clip_coef_bounds": (0.01, "x")}, "clip_coef_bounds=(0.01, 'x')"),
        ({"args.num_steps": 16.5, "iteration": None}, "num_steps=16.5, iteration=None"),
        ({"global_step": "64"}, "global_step='64'"),
        ({"rng": None}, "does not fit this version of ppo_atari_envpool.py (KeyError)"),
        ({"model.actor_encoder.0.weight": torch.zeros(8, 4, 8, 8)}, "does not fit this version of ppo_atari_envpool.py"),
        ({"model.actor_encoder.0.bias": None}, "does not fit this version of ppo_atari_envpool.py (RuntimeError)"),
        ({"optimizer": [1]}, "does not fit this version of ppo_atari_envpool.py"),
    ],
)
def test_a_crafted_checkpoint_is_refused_with_one_line_before_its_run_gains_a_file(
    tmp_path, monkeypatch, capsys, changes, fragment
):
    """Stored flags of the wrong type, missing entries, weights of another shape: exit 2 with one line, before anything
    is written to the run or printed (no new event file, no progress line)."""
    import ppo_atari_envpool

    checkpoint = crafted_checkpoint(str(tmp_path / "run"), changes)
    files = sorted(os.listdir(tmp_path / "run"))
    line = usage_error(ppo_atari_envpool.main, monkeypatch, capsys, [SCRIPT, "--resume", checkpoint, "--no-cuda"])
    assert fragment in line
    assert sorted(os.listdir(tmp_path / "run")) == files


def test_a_full_disk_names_the_checkpoint_to_resume_only_when_there_is_one(tmp_path, monkeypatch, capsys):
    """TensorBoard's writer thread meets a full disk (its OSError names no file): the line names the run's checkpoint
    when it has one, and says nothing of resuming when it has none."""
    import ppo_atari_envpool

    monkeypatch.setattr(ppo_atari_envpool, "RUN_DIR", str(tmp_path))
    full = OSError(errno.ENOSPC, "No space left on device")
    for checkpoint in (False, True):
        if checkpoint:
            (tmp_path / "checkpoint.pt").write_bytes(b"the last checkpoint")
        with pytest.raises(SystemExit) as exited:
            ppo_atari_envpool.stop_on_write_error(full)
        resume = f"; the last checkpoint is intact: free space, then --resume {tmp_path}/checkpoint.pt" if checkpoint else ""
        assert exited.value.code == 1
        assert capsys.readouterr().err == f"error: cannot write the event file: No space left on device{resume}\n"


def test_a_write_error_named_in_bytes_is_one_line(capsys):
    """TensorBoard's writer names the file of an OSError in bytes (seen when a run's directory was deleted under it):
    the line names it as text, not a TypeError from joining bytes and str."""
    import ppo_atari_envpool  # noqa: PLC0415 - as the tests above

    with pytest.raises(SystemExit) as exit_info:
        ppo_atari_envpool.stop_on_write_error(OSError(28, "No space left on device", b"/gone/events.out.tfevents.1"))
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == "error: cannot write /gone/events.out.tfevents.1: No space left on device\n"
