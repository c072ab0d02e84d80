"""The benchmark scripts on tiny budgets: each runs and prints what it says it measures."""

import importlib.util
import os
import re
import sys
import threading

import pytest
import torch
from conftest import ROOT, run_script, usage_error
from torch.utils.tensorboard import SummaryWriter


def random_policy(*flags):
    result = run_script("benchmarks/random_policy.py", *flags)
    assert result.returncode == 0, result.stderr
    match = re.search(
        r"(\d+) episodes of uniformly random actions: mean return (-?[\d.]+) .* mean length ([\d.]+)", result.stdout
    )
    assert match, result.stdout
    return int(match[1]), float(match[2]), float(match[3])


@pytest.mark.parametrize("flags", [["--env-id", "BigfishEasy-v0"], ["--env-id", "BigfishEasy-v0", "--num-levels", "1"]])
def test_random_policy_on_procgen(flags):
    episodes, mean_return, mean_length = random_policy(*flags, "--episodes", "20", "--num-envs", "4")
    assert episodes == 20 and 0 <= mean_return <= 40 and mean_length > 1  # BigFish pays +1 a fish, +10 at the end


def test_random_policy_on_mujoco():
    episodes, mean_return, mean_length = random_policy("--env-id", "Hopper-v5", "--episodes", "8", "--num-envs", "4")
    assert episodes == 8 and mean_length > 1 and -50 < mean_return < 100  # a random Hopper falls over at once


def refusal(monkeypatch, capsys, script: str, flags: list[str]) -> str:
    """A benchmark's main() run in-process (torch and EnvPool imported once for every case; `--help` runs each as a
    process): it must exit 2 with one "error: ..." line, which is returned."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    return usage_error(importlib.import_module(script).main, monkeypatch, capsys, [f"{script}.py", *flags])


def test_sps_benchmark_compares_eager_and_defaults_and_reports_a_failed_run(monkeypatch, capsys):
    """One real measurement (main() in this process, each setting a tiny training run as a process of its own): a
    candidate flag set the script rejects fails alone and the benchmark goes on, then exits 1; the main table. The
    torchrun, thread-split and MuJoCo-backend tables have their own test below, with the runs faked (torchrun's own
    runs are the scripts' tests)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    sps = importlib.import_module("sps")
    monkeypatch.setattr(sps, "FAILED_RUNS", [])
    flags = "--scripts ppo_atari_envpool.py --num-envs 2 --num-steps 16 --total-timesteps 64 --metrics-interval 2"
    flags += " --metrics-batch 16 --repeats 1 --raw-steps 20 --candidates no-such-flag"
    monkeypatch.setattr(sys, "argv", ["sps.py", *flags.split()])
    with pytest.raises(SystemExit) as exited:
        sps.main()
    captured = capsys.readouterr()
    assert exited.value.code == 1, captured.err
    assert any(
        line.startswith("failed: ppo_atari_envpool.py --no-such-flag") and "status 2" in line
        for line in captured.err.splitlines()
    ), captured.err
    lines = captured.out.splitlines()
    assert any(line.startswith("EnvPool raw rate, Breakout-v5") for line in lines)
    main_table = lines[lines.index(next(line for line in lines if line.startswith("SPS with metrics every 2"))) + 1 :]
    assert main_table[0].split()[:8] == ["SPS", "eager", "SPS", "defaults", "SPS", "--no-such-flag", "defaults", "/"]
    row = next(line for line in main_table if line.startswith("ppo_atari_envpool.py")).split()
    eager, defaults, ratio = (float(row[i].replace(",", "")) for i in (2, 3, 5))
    assert row[4] == "failed" and eager > 0 and defaults > 0 and ratio == pytest.approx(defaults / eager, abs=0.02)
    assert row[6] == "failed"  # the candidate's ratio to the eager path
    assert not any(line.startswith("one run, metrics every 2") for line in lines)  # no torchrun table without --nproc


def test_sps_benchmark_torchrun_thread_split_and_mujoco_backend_tables(monkeypatch, capsys):
    """compare_torchrun times one process against --nproc; compare_thread_split runs --jobs runs at once with torch's
    default threads, then with the cores split between them; compare_mujoco_backends times PPO on each backend and each
    simulator alone: here with the training runs and EnvPool faked (a real run is the test above), MuJoCo Warp's Ant
    stepped for real."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    sps = importlib.import_module("sps")
    calls = []

    def training_sps(args, script, metrics_interval, nproc=1, threads=0, flags=()):
        calls.append((script, nproc, threads, tuple(flags)))
        if flags:  # a backend's PPO run
            return 500.0 if "mjwarp" in flags else 400.0
        return 150.0 if threads else 100.0

    monkeypatch.setattr(sps, "training_sps", training_sps)
    monkeypatch.setattr(sps, "raw_envpool_sps", lambda env_id, num_envs, steps: 7000.0)
    monkeypatch.setattr(sps.os, "cpu_count", lambda: 2)
    args = sps.Args(scripts=("ppo_atari_envpool.py",), num_envs=2, jobs=2, repeats=1, warp_steps=3, metrics_interval=2)
    args.nproc = 2
    sps.compare_torchrun(args)
    assert calls == [("ppo_atari_envpool.py", nproc, 0, ()) for nproc in (1, 2)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("one run, metrics every 2: 1 process x 2 envs against 2 torchrun processes x 1 envs")
    assert lines[3].split()[:5] == ["ppo_atari_envpool.py", "(Breakout-v5)", "100", "100", "1.00"], lines[3]
    calls.clear()
    sps.compare_thread_split(args)
    assert sorted(calls) == [("ppo_atari_envpool.py", 1, threads, ()) for threads in (0, 0, 1, 1)]  # 2 runs each
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("2 runs at once, metrics every 2: per-run SPS with torch's default threads against 1 thr")
    assert lines[3].split()[:5] == ["ppo_atari_envpool.py", "(Breakout-v5)", "100", "150", "1.50"], lines[3]
    calls.clear()
    sps.compare_mujoco_backends(args)
    assert calls == [("ppo_isaacgym.py", 1, 0, ("--backend", backend)) for backend in ("envpool", "mjwarp")]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("Ant at 2 envs") and lines[2].split() == ["env", "steps/s", "alone", "PPO", "SPS"]
    assert lines[3].split()[-2:] == ["7,000", "400"] and lines[3].startswith("EnvPool, Ant-v5 (CPU)")
    assert lines[4].startswith("MuJoCo Warp, Ant (CPU, ") and lines[4].split()[-1] == "500"
    assert float(lines[4].split()[-2].replace(",", "")) > 0  # Warp's Ant alone, measured


SPS_COUNTS = "num-envs num-steps metrics-interval metrics-batch repeats raw-steps warp-steps total-timesteps".split()
SPS_COUNTS += ["kinetix-steps", "kinetix-iterations"]


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--cuda"], "error: --cuda: no CUDA device"),
        (["--jobs", "2", "--cuda"], "error: --jobs 2: >= 1, and 1 with --cuda"),  # on a GPU the scripts take 1 thread
        (["--scripts"], "error: --scripts names no script, and --mjwarp and --kinetix are off"),
        (["--repeats", "0"], "error: --repeats 0: must be at least 1"),  # it printed an empty table and exited 0
        (["--num-envs", "-4"], "error: --num-envs -4: must be at least 1"),  # it ended in EnvPool's traceback
        (["--steady", "--total-timesteps", "1024"], "error: --steady: --total-timesteps 1024 is under 2 iterations"),
        (["--candidates", "torch-threads 16"], "error: --candidates 'torch-threads 16': give flags without dashes"),
        # every count checked (--jobs 0, refused after them, ends a run that would pass them); 2 iterations do for --steady,
        # and a candidate's value joined by = is a flag
        *[([f"--{flag}", "0", "--jobs", "0"], f"error: --{flag} 0: must be at least 1") for flag in SPS_COUNTS],
        (["--steady", "--total-timesteps", "2048", "--jobs", "0"], "error: --jobs 0"),  # 2 batches of 8 x 128
        (["--candidates", "torch-threads=16", "compile cudagraphs", "--jobs", "0"], "error: --jobs 0"),
        # --kinetix: each size at least 1, a batch that splits into ppo_kinetix.py's 32 minibatches, an iteration timed
        (["--kinetix", "--kinetix-envs", "256", "0"], "error: --kinetix-envs 0: must be at least 1"),
        (["--kinetix-envs", "256"], "error: --kinetix-envs: the Kinetix table needs --kinetix"),
        (
            ["--kinetix", "--kinetix-envs", "256", "3", "--num-steps", "4"],
            "error: --kinetix-envs 3: 3 envs x --num-steps 4 = 12 steps do not split into ppo_kinetix.py's 32 minibatches",
        ),
        (["--kinetix", "--num-envs", "2", "--num-steps", "4"], "error: --num-envs 2: 2 envs x --num-steps 4 = 8"),
        (["--kinetix", "--kinetix-iterations", "1"], "error: --kinetix-iterations 1: at least 2 (the last, which"),
        (["--kinetix", "--steady", "--kinetix-iterations", "2"], "error: --kinetix-iterations 2: at least 3 with --steady"),
        (["--kinetix", "--kinetix-iterations", "2", "--nproc", "3"], "error: --nproc 3"),  # 2 do without --steady
    ],
)
def test_sps_benchmark_refuses_what_it_cannot_measure_in_one_line(flags, error, monkeypatch, capsys):
    assert refusal(monkeypatch, capsys, "sps", flags).startswith(error)


def test_sps_benchmark_refuses_kinetix_without_kinetix_or_without_jaxs_gpu_on_a_gpu(monkeypatch, capsys):
    pytest.importorskip("kinetix", reason="needs Kinetix (make setup: requirements-nodeps.txt)")
    find_spec = importlib.util.find_spec
    with monkeypatch.context() as patch:  # Kinetix not installed
        patch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "kinetix" else find_spec(name, *rest))
        error = refusal(patch, capsys, "sps", ["--scripts", "--kinetix"])
    assert error.startswith("error: --kinetix: Kinetix is not installed"), error
    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if any(device.platform == "gpu" for device in jax.devices()):
        pytest.skip("JAX has a GPU here")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch sees a GPU, JAX (its CPU build) none
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    error = refusal(monkeypatch, capsys, "sps", ["--scripts", "--kinetix", "--cuda"])
    assert error.startswith("error: --kinetix --cuda: JAX sees no GPU here (make kinetix-cuda"), error


@pytest.mark.parametrize(
    "script, flags, error",
    [
        ("async_envs", ["--num-envs", "1"], "error: --num-envs 1: must be at least 2"),  # it ended in EnvPool's traceback
        ("async_envs", ["--steps", "0"], "error: --steps 0: must be at least 1"),  # it printed rates of 0 and exited 0
        ("host_threads", ["--repeats", "0"], "error: --repeats 0: must be at least 1"),  # a statistics traceback
        ("host_threads", ["--num-envs", str(10**20)], f"error: --num-envs {10**20}: must be at least 1, at most 65536"),
        ("random_policy", ["--env-id", "Nope-v1"], "error: --env-id Nope-v1: not an EnvPool task"),  # EnvPool's assert
        ("random_policy", ["--episodes", "0"], "error: --episodes 0: must be at least 1"),  # it printed nan and exited 0
        ("random_policy", ["--env-id", "Hopper-v5", "--num-levels", "1"], "error: --num-levels 1: Procgen only"),
        ("ratio_noise", ["--iterations", "0"], "error: --iterations 0: must be at least 1"),  # exit 1, after the header
        ("ratio_noise", ["--num-envs"], "error: --num-envs: give one N_envs or more"),  # the header alone, exit 0
        ("bf16_update", ["--threads", "0"], "error: --threads 0: must be at least 1, at most 1024"),  # ran at full size
        ("bf16_update", ["--rounds", "1"], "error: --rounds 1: must be at least 2"),  # the first round is dropped
        ("bf16_update", ["--scale", "nan"], "error: --scale nan: must be > 0 and at most 1"),
        ("read_events", ["--repeats", "0"], "error: --repeats 0: must be at least 1, at most 10000000"),
        ("read_events", ["--run-dir", ROOT], f"error: --run-dir {ROOT}: no TensorBoard event file there"),
    ],
)
def test_benchmarks_refuse_bad_counts_in_one_line_before_making_envs(script, flags, error, monkeypatch, capsys):
    assert refusal(monkeypatch, capsys, script, flags).startswith(error)


@pytest.mark.parametrize(
    "script, flags, error",
    [
        (
            "random_policy",
            ["--seed", "2147483633"],
            "error: --seed 2147483633: must be at least 0, at most 2147483632",
        ),  # 16 envs
        ("random_policy", ["--env-id", "BigfishEasy-v0", "--num-levels", "0"], "error: --num-levels 0: must be at least 1"),
        (
            "random_policy",
            ["--env-id", "BigfishEasy-v0", "--num-levels", "1", "--start-level", "-1"],
            "error: --start-level -1",
        ),
        ("ratio_noise", ["--num-envs", "8", "0"], "error: --num-envs 0: must be at least 1"),  # the smallest is checked
        ("bf16_update", ["--scale", "0"], "error: --scale 0.0: must be > 0 and at most 1"),
        ("bf16_update", ["--threads", "1025"], "error: --threads 1025: must be at least 1, at most 1024"),
    ],
)
def test_benchmarks_refuse_edge_values_before_any_work(script, flags, error, monkeypatch, capsys):
    """The first work each would start (EnvPool, a training process, the timed networks) raises here: a value the
    checks let through fails at once instead of running the benchmark."""

    def work(*args, **kwargs):
        raise AssertionError(f"{script} started work with {flags}")

    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    module = importlib.import_module(script)
    owner, name = {"random_policy": ("envpool", "make"), "ratio_noise": ("subprocess", "run")}.get(script, ("", "networks"))
    monkeypatch.setattr(getattr(module, owner) if owner else module, name, work)
    assert refusal(monkeypatch, capsys, script, flags).startswith(error)


def test_sps_benchmark_reads_the_rate_of_the_whole_run_or_after_the_first_iteration(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    sps = importlib.import_module("sps")
    writer = SummaryWriter(str(tmp_path))
    for step, walltime, value in ((100, 10.0, 5), (300, 12.0, 15), (500, 14.0, 20)):  # the first iteration took 10 s
        writer.add_scalar("charts/SPS", value, step, walltime=walltime)
    writer.close()
    event_file = next(tmp_path.glob("events.out.tfevents.*"))
    assert sps.logged_sps(str(event_file), steady=False) == 20  # the script's own: 500 steps in 25 s
    assert sps.logged_sps(str(event_file), steady=True) == pytest.approx(100.0)  # 400 steps in 4 s


def test_sps_benchmark_leaves_the_last_iterations_of_a_run_untimed_if_asked(tmp_path, monkeypatch):
    """ppo_kinetix.py evaluates the solve rate after its last iteration (--eval-interval 0): that iteration is not timed."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    sps = importlib.import_module("sps")
    writer = SummaryWriter(str(tmp_path))
    for step, walltime, value in ((100, 10.0, 5), (300, 12.0, 15), (500, 14.0, 20), (600, 20.0, 18)):  # the last: 6 s
        writer.add_scalar("charts/SPS", value, step, walltime=walltime)
    writer.close()
    event_file = str(next(tmp_path.glob("events.out.tfevents.*")))
    assert sps.logged_sps(event_file, steady=False, untimed_last=1) == 20
    assert sps.logged_sps(event_file, steady=True, untimed_last=1) == pytest.approx(100.0)  # 400 steps in 4 s
    assert sps.logged_sps(event_file, steady=True) == pytest.approx(50.0)  # 500 steps in 10 s


def test_sps_benchmark_times_kinetix_alone_for_real(monkeypatch, kinetix_step):
    """kinetix_sps for real, in this process, at 16 envs of the S levels (the compiled step that the kinetix_step
    fixture leaves in JAX's cache): a positive rate, torch's threads given back. PPO's half of the table is a
    ppo_kinetix.py run timed as every script's (tests above); the next test checks the table with both measurements
    faked."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    sps = importlib.import_module("sps")
    threads = torch.get_num_threads()
    assert sps.kinetix_sps("s", 16, 3, "cpu") > 0
    assert torch.get_num_threads() == threads


def test_sps_benchmark_kinetix_table_measures_each_size_ppo_then_alone_and_reports_a_failure(monkeypatch, capsys):
    """compare_kinetix with both measurements faked: each size of --kinetix-envs in turn, PPO then Kinetix alone (never
    at once), a ppo_kinetix.py run of --kinetix-iterations batches on the hand-designed levels; a size whose measurement
    raises reads `failed` and the others still print."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    sps = importlib.import_module("sps")
    monkeypatch.setattr(sps, "FAILED_RUNS", [])
    calls = []

    def alone(size, num_envs, steps, device):
        calls.append(("alone", num_envs))
        if num_envs == 64:
            raise MemoryError("out of memory")
        assert (size, steps, device) == ("m", 7, "cpu")
        return 1000.0 * num_envs

    def ppo(run, script, metrics_interval):
        calls.append(("ppo", run.num_envs))
        assert script == "ppo_kinetix.py" and metrics_interval == 3 and run.steady
        assert run.total_timesteps == 5 * run.num_envs * 16  # --kinetix-iterations batches
        return 250.0 * run.num_envs

    monkeypatch.setattr(sps, "kinetix_sps", alone)
    monkeypatch.setattr(sps, "training_sps", ppo)
    args = sps.Args(kinetix=True, kinetix_envs=(256, 64, 2048), kinetix_env_size="m", kinetix_steps=7, num_steps=16)
    args.kinetix_iterations, args.metrics_interval, args.steady = 5, 3, True
    sps.compare_kinetix(args)
    assert calls == [("ppo", 256), ("alone", 256), ("ppo", 64), ("alone", 64), ("ppo", 2048), ("alone", 2048)]
    captured = capsys.readouterr()
    assert captured.err == "failed: Kinetix alone at 64 envs: MemoryError: out of memory\n" and len(sps.FAILED_RUNS) == 1
    lines = captured.out.splitlines()
    assert lines[1].startswith("Kinetix, hand-designed M levels, on CPU, "), lines[1]
    assert "16 steps a rollout, iterations 2 to 4 of 5 timed, 1 with metrics)" in lines[1]  # iteration 3
    assert [row.split() for row in lines[3:]] == [
        ["256", "envs", "256,000", "64,000", "0.250"],
        ["64", "envs", "failed", "16,000", "failed"],
        ["2048", "envs", "2,048,000", "512,000", "0.250"],
    ]
    # the run's task: the hand-designed levels, the solve rate only after the last iteration (not timed), no time on others
    assert sps.task_flags(args, "ppo_kinetix.py") == [
        "--task-set",
        "handmade",
        "--env-size",
        "m",
        "--num-minibatches",
        "32",
        "--eval-interval",
        "0",
        "--no-eval-handmade",
    ]


def test_sps_benchmark_kinetix_table_on_a_gpu_gives_the_ppo_runs_peak_memory(monkeypatch, capsys):
    """With --cuda, the GPU memory in use (faked cudaMemGetInfo: 80 GiB in all) is polled while each PPO run goes on:
    the column is the highest level above the one at the run's start, a peak that the run gave back included."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    sps = importlib.import_module("sps")
    used, total, polled = [2 * 2**30], 80 * 2**30, threading.Semaphore(0)

    def mem_get_info():
        polled.release()
        return total - used[0], total

    def ppo(run, script, metrics_interval):
        used[0] += run.num_envs * 2**20  # 1 MiB an environment ...
        for _ in range(4):  # ... until the poller has seen it (a call at the start, polls), then 1 GiB kept
            assert polled.acquire(timeout=10)
        used[0] = 3 * 2**30
        return 100.0

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "a faked GPU")
    monkeypatch.setattr(sps, "kinetix_sps", lambda *_: 400.0)
    monkeypatch.setattr(sps, "training_sps", ppo)
    sps.compare_kinetix(sps.Args(kinetix=True, kinetix_envs=(2048, 65536), cuda=True))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("Kinetix, hand-designed S levels, on a faked GPU: "), lines[1]
    assert lines[2].split("  ")[-1] == "PPO peak GPU memory (GiB)"
    assert [row.split() for row in lines[3:]] == [
        ["2048", "envs", "400", "100", "0.250", "2.0"],
        ["65536", "envs", "400", "100", "0.250", "64.0"],
    ]


def test_async_envs_benchmark_times_the_three_modes():
    result = run_script(
        "benchmarks/async_envs.py", "--num-envs", "2", "--steps", "5", "--repeats", "1", env={"OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "sync, 2 envs",
        "async, pool of 4 in batches of 2",
        "async, pool of 2 in batches of 1",
    ]
    assert all(float(line.split()[-2].replace(",", "")) > 0 for line in lines)


def test_bf16_update_benchmark_times_each_network_in_both_precisions():
    result = run_script("benchmarks/bf16_update.py", "--scale", "0.004", "--rounds", "2", "--steps", "1", "--threads", "1")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith(("ppo_", "pqn_"))]
    assert [row.split()[0] for row in rows] == [
        "ppo_atari_envpool.Agent",
        "pqn_atari.QNetwork",
        "ppo_procgen.Agent",
        "ppo_isaacgym.Agent",
    ]
    for row in rows:
        minibatch, fp32, bf16, ratio = (float(cell) for cell in row.split()[-4:])
        assert minibatch >= 1 and fp32 > 0 and bf16 > 0 and ratio == pytest.approx(fp32 / bf16, rel=0.05)  # of rounded cells


def test_ratio_noise_benchmark_prints_the_first_minibatch_in_both_precisions():
    flags = ["--num-envs", "2", "--num-steps", "16", "--iterations", "1"]
    result = run_script("benchmarks/ratio_noise.py", *flags, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("2 envs")]
    assert [row[2] for row in rows] == ["fp32", "bf16"]
    assert all(float(row[3]) >= 0 and float(row[5]) == 0 for row in rows)  # k3 >= 0; no ratio leaves 1 +- 0.1


def test_learning_table_of_two_runs(tmp_path):
    for name, returns in (("a", range(100)), ("b", [5.0] * 100)):
        writer = SummaryWriter(str(tmp_path / name))
        for game, value in enumerate(returns):
            writer.add_scalar("charts/episodic_return", value, 10 * (game + 1))  # the last game ends at step 1000
        writer.close()
    result = run_script("benchmarks/learning_table.py", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in result.stdout.splitlines()[2:]]
    rows = {row[0]: row[1:] for row in rows}
    assert rows["first 50 games"] == ["24.50 (50)", "5.00 (50)"]
    assert rows["games ending after 90 % of the steps"][0] == "94.50 (10)"  # steps 910..1000: returns 90..99
    assert rows["best game"] == ["99", "5"]
    assert run_script("benchmarks/learning_table.py", str(tmp_path / "none")).returncode == 1


def test_host_threads_benchmark_times_envpool_alone_and_with_the_copy_on_1_and_all_threads():
    result = run_script("benchmarks/host_threads.py", "--num-envs", "2", "--steps", "5", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.startswith("Breakout-v5, 2 envs") and len(rows) == 3, result.stdout
    assert [row.split("  ")[0] for row in rows][:2] == ["EnvPool alone", "and the copy, torch on 1 thread"]
    rates_and_ratios = [[float(cell.replace(",", "")) for cell in row.split()[-2:]] for row in rows]
    assert rates_and_ratios[0][1] == 1.0 and all(rate > 0 and ratio > 0 for rate, ratio in rates_and_ratios)


def test_read_events_benchmark_reads_the_points_of_a_resumed_run_as_tensorboard_does():
    """A synthetic run of 40 iterations, resumed from iteration 24 after logging to 28 (purge_step): both readers read
    the same points, the purged ones once."""
    result = run_script("benchmarks/read_events.py", "--iterations", "40", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    # 40 iterations x 14 tags, 4 x 9 metrics, 20 games x 2 tags
    assert "636 points in 25 tags; the same points from both readers: True" in result.stdout, result.stdout
    assert re.search(r"EventAccumulator [\d.]+ s, read_scalars [\d.]+ s: [\d.]+ x", result.stdout), result.stdout


@pytest.mark.parametrize(
    "script",
    [
        "async_envs",
        "bf16_update",
        "host_threads",
        "kinetix_random_policy",
        "random_policy",
        "ratio_noise",
        "read_events",
        "sps",
    ],
)
def test_benchmark_help_says_what_it_measures(script, monkeypatch, capsys):
    """--help shows the module's docstring (what it measures, example commands) before the flags: main() in this
    process, as the refusals above (a process each cost about 2.5 s of imports; the scripts run as processes in the
    tests of what they measure)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--help"])
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(script).main()
    first_line = open(os.path.join(ROOT, "benchmarks", f"{script}.py")).read().split('"""')[1].splitlines()[0]
    out = capsys.readouterr().out
    assert exited.value.code == 0 and first_line in out, out
