"""sweeps/aggregate.py's modes, each on hand-made event files with a known answer: the curves' x-axis (environment
steps, policy updates, wall-clock time), the max or final score, the best configuration per value of a flag, a heatmap
of two swept flags, the batch-multiplier figure (N_envs against N_RO), DDR against score by budget, steps per second,
and `curves --metrics` (the demo's row of panels). No training run: each test writes its event files itself."""

import json
import os
import sys

import numpy as np
import pytest
from conftest import ROOT, usage_error

AGGREGATE = os.path.join(ROOT, "sweeps", "aggregate.py")


def write_events(run_dir, events, first_wall=1000.0, purge_step=None, name="events.out.tfevents.1.host"):
    """An event file as SummaryWriter writes one: its file_version event at `first_wall` (the writer's opening), a
    SessionLog START at `purge_step` for a resumed session, then `events`: (wall time, step, {tag: value})."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.summary.writer.record_writer import RecordWriter

    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, name), "wb") as f:
        records = RecordWriter(f)
        records.write(Event(wall_time=first_wall, file_version="brain.Event:2").SerializeToString())
        if purge_step is not None:
            start = Event(wall_time=first_wall, step=purge_step, session_log=SessionLog(status=SessionLog.START))
            records.write(start.SerializeToString())
        for wall, step, values in events:
            event = Event(wall_time=wall, step=step)
            for tag, value in values.items():
                event.summary.value.add(tag=tag, simple_value=value)
            records.write(event.SerializeToString())


def write_run(sweep, env_id, config, seed, events, done=True, **flags):
    """A run directory of a sweep: args.json (PPO's 8 x 128 by default, 4 epochs of 4 minibatches; `flags` replace
    them) and one event file."""
    run_dir = os.path.join(sweep, f"{env_id}__{config}__{seed}__100")
    args = {"env_id": env_id, "exp_name": config, "seed": seed, "num_envs": 8, "num_steps": 128, "schedule": None}
    args |= {"update_epochs": 4, "num_minibatches": 4, "minibatch_size": None, "num_iterations": 4, "learning_rate": 2.5e-4}
    args |= flags
    args.setdefault("batch_size", args["num_envs"] * args["num_steps"])
    args.setdefault("planned_steps", args["num_iterations"] * args["batch_size"])
    args.setdefault("total_timesteps", args["planned_steps"])
    write_events(run_dir, events)
    with open(os.path.join(run_dir, "args.json"), "w") as f:
        json.dump(args, f)
    if done:
        open(os.path.join(run_dir, "done.json"), "w").write("{}")
    return run_dir


def returns_at(steps, values, wall=None):
    """Events of episodic returns at these steps (wall time: 1000 + step / 100 unless given)."""
    return [
        (1000 + step / 100 if wall is None else wall, step, {"charts/episodic_return": value})
        for step, value in zip(steps, values, strict=True)
    ]


@pytest.fixture
def aggregate(monkeypatch):
    """The module, its notes this test's own, its figures captured (each panel's title, labels and lines) and closed
    unwritten, its runs read in this process."""
    from sweeps import aggregate

    monkeypatch.setattr(aggregate, "DATA_NOTES", [])
    aggregate.figures = {}

    def save(figure, path, pdf):
        aggregate.figures[os.path.basename(path)] = figure
        open(path, "w").close()  # listed, as the real one would be

    monkeypatch.setattr(aggregate, "save", save)
    no_pool = NotImplementedError("read in this process")
    monkeypatch.setattr(aggregate.concurrent.futures, "ProcessPoolExecutor", lambda *_: (_ for _ in ()).throw(no_pool))
    yield aggregate
    for figure in aggregate.figures.values():
        aggregate.pyplot().close(figure)


def lines_of(axis):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axis.lines}


def run_main(aggregate, monkeypatch, *arguments):
    monkeypatch.setattr(sys, "argv", [AGGREGATE, *map(str, arguments)])
    aggregate.main()


# --------------------------------------------------------------------------------------
# --x steps | updates | time
# --------------------------------------------------------------------------------------


def test_updates_are_iterations_times_epochs_times_minibatches_per_phase(aggregate):
    """8 x 128 with 4 epochs of minibatches of 256 states: 16 updates per 1024-step iteration; a --schedule phase
    32 x 32 from step 2048 with minibatches of 512: 8 per iteration. A script without phases (Isaac Gym, Kinetix):
    its minibatch size, else batch / num_minibatches."""
    phases = {"batch_size": 1024, "update_epochs": 4, "num_minibatches": 4, "planned_steps": 4096}
    phases["phases"] = [[0, 8, 128, 256], [2048, 32, 32, 512]]
    steps, updates = aggregate.update_knots(phases)
    assert steps.tolist() == [0, 2048, 4096] and updates.tolist() == [0, 32, 48]
    run = {"dir": "/runs/a", "args": phases, "total_steps": 4096}
    assert aggregate.x_map(run, "updates")(np.array([1024, 3072, 4096])).tolist() == [16, 40, 48]
    # a phase whose start is not a batch boundary: its first iteration starts at the first iteration end after it
    odd = phases | {"phases": [[0, 8, 128, 256], [1500, 32, 32, 512]]}
    assert aggregate.update_knots(odd)[0].tolist() == [0, 2048, 4096]
    flat = {"batch_size": 2048, "update_epochs": 3, "num_minibatches": 8, "num_envs": 16, "num_steps": 128}
    assert aggregate.update_knots(flat | {"num_iterations": 5})[1].tolist() == [0, 5 * 3 * 8]
    assert aggregate.update_knots(flat | {"num_iterations": 5, "minibatch_size": 1024})[1].tolist() == [0, 5 * 3 * 2]


def test_curves_x_updates_and_time_a_resumed_run_counts_neither_its_pause_nor_its_lost_steps(aggregate, monkeypatch, tmp_path):
    """A run of 1024-step iterations (16 updates each) interrupted after its checkpoint at step 2048, resumed an hour
    later: its second session purges step 3072 and trains it again. Its clock: the first session's 10 s an iteration,
    then the second session's, whose file opens after its first iteration (at wall 5012, step 3072, SPS 1024 / 10 s:
    it started at 5002). The episode at step 1536 (logged with step 2048's iteration) is half-way between."""
    run_dir = str(tmp_path / "Breakout-v5__ppo__1__100")
    charts = lambda value: {"charts/SPS": value, "losses/value_loss": 1.0}  # noqa: E731
    first = [(1010, 1024, charts(102)), (1020, 2048, charts(102)), (1020, 1536, {"charts/episodic_return": 1.0})]
    first += [(1030, 3072, charts(102)), (1030, 3000, {"charts/episodic_return": 99.0})]  # after the checkpoint: purged
    write_run(str(tmp_path), "Breakout-v5", "ppo", 1, first)
    second = [(5012, 3072, charts(102.4)), (5012, 3000, {"charts/episodic_return": 3.0}), (5022, 4096, charts(102.4))]
    write_events(run_dir, second, first_wall=5012, purge_step=2049, name="events.out.tfevents.2.host")

    out = tmp_path / "curve.png"
    run_main(aggregate, monkeypatch, "curves", run_dir, "--smooth", 1, "--x", "time", "--out", out)
    axis = aggregate.figures["curve.png"].axes[0]
    assert axis.get_xlabel() == "wall-clock time (seconds)"
    assert lines_of(axis)["Breakout-v5__ppo__1__100"] == ([15.0, pytest.approx(30 - 72 / 1024 * 10)], [1.0, 3.0])
    run_main(aggregate, monkeypatch, "curves", run_dir, "--smooth", 1, "--x", "updates", "--out", out, "--tag", "charts/SPS")
    axis = aggregate.figures["curve.png"].axes[0]
    assert axis.get_xlabel() == "policy updates (gradient steps)"
    assert lines_of(axis)["Breakout-v5__ppo__1__100"][0] == [16, 32, 48, 64]
    run = aggregate.load_run_dirs([run_dir])[0]
    assert run["clock"][0].tolist() == [1024, 2048, 3072, 4096]
    assert run["clock"][1] == pytest.approx([10, 20, 30, 40])  # the hour's pause and the lost iteration left out


def test_report_x_time_puts_every_curve_on_the_runs_clocks(aggregate, tmp_path):
    """Two seeds, one twice as slow (1 and 2 minutes an iteration): on the time axis (minutes: the slow one takes 4),
    the fast one's curve ends half-way; the metric curves share the axis and its label."""
    for seed, seconds_per_step in ((1, 60 / 1024), (2, 120 / 1024)):
        values = {"charts/episodic_return": 10.0 * seed, "metrics/weight_norm": 5.0}
        events = [(1000 + step * seconds_per_step, step, values) for step in (1024, 2048)]
        write_run(str(tmp_path), "Hopper-v4", "ppo", seed, events, num_iterations=2)
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.5, 4, 100, pdf=False, include_unfinished=False, x="time")
    curves = aggregate.figures["learning_curves.png"].axes[0]
    assert curves.get_xlabel() == "wall-clock time (minutes)"
    grid, mean = lines_of(curves)["ppo (2)"]
    assert grid == [1, 2, 3, 4] and mean == [10, 15, 20, 20]  # seed 1 alone, both, seed 2 alone (seed 1 has ended)
    assert aggregate.figures["metric_curves.png"].axes[0].get_xlabel() == "wall-clock time (minutes)"
    assert "x-axis of the curves: wall-clock time of training" in (tmp_path / "report" / "report.md").read_text()


# --------------------------------------------------------------------------------------
# --score max | final
# --------------------------------------------------------------------------------------


def test_max_score_is_the_highest_windowed_mean_over_training(aggregate, tmp_path):
    """Returns that rise to 10 at step 400 and fall to 0: with windows of 20 % of the 1000 steps, the final score is the
    mean of the last window (1 and 0: 0.5) and the max that of (300, 500]: (10 + 8) / 2 = 9; the window (0, 200] that
    ends at step 200 counts, the shorter one that ends at step 100 does not."""
    steps, values = list(range(100, 1001, 100)), [0.0, 2.0, 4.0, 10.0, 8.0, 6.0, 4.0, 2.0, 1.0, 0.0]
    assert aggregate.max_window_mean(np.array(steps), np.array(values), 200) == 9.0
    assert aggregate.max_window_mean(np.array([100, 150]), np.array([50.0, 1.0]), 200) == -np.inf
    write_run(str(tmp_path), "Hopper-v4", "ppo", 1, returns_at(steps, values), num_iterations=1, batch_size=1000)
    run = aggregate.load_runs(str(tmp_path), include_unfinished=False)[0]
    assert aggregate.final_score(run, 0.2) == 0.5 and aggregate.final_score(run, 0.2, "max") == 9.0
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.2, 4, 100, pdf=False, include_unfinished=False, score="max")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Max return = the highest mean over the episodes ending in a window of 20% of each run's steps" in text
    row = next(line for line in text.splitlines() if line.startswith("| ppo | 8 | 128 |"))
    assert row.split(" | ")[6].startswith("9.000") and "| IQM max return [95 % CI] |" in text


# --------------------------------------------------------------------------------------
# --best FLAG
# --------------------------------------------------------------------------------------


def test_best_keeps_per_game_and_value_the_configuration_with_the_highest_iqm(aggregate, tmp_path):
    """Two learning rates x annealing or not, two games: at LR 1e-3 annealing wins on Hopper and loses on Walker2d; at
    LR 3e-4 one configuration has the value. Each kept configuration's runs make the value's row."""
    finals = {  # (config, lr): {game: the two seeds' final returns}
        ("lr1e-3_anneal", 1e-3): {"Hopper-v4": [10.0, 12.0], "Walker2d-v4": [1.0, 1.0]},
        ("lr1e-3_constant", 1e-3): {"Hopper-v4": [5.0, 5.0], "Walker2d-v4": [7.0, 9.0]},
        ("lr3e-4_anneal", 3e-4): {"Hopper-v4": [2.0, 2.0], "Walker2d-v4": [3.0, 3.0]},
    }
    for (config, lr), by_game in finals.items():
        for game, values in by_game.items():
            for seed, value in enumerate(values, 1):
                write_run(str(tmp_path), game, config, seed, returns_at([4000], [value]), learning_rate=lr)
    aggregate.report(
        str(tmp_path), str(tmp_path / "report"), 0.5, 4, 100, pdf=False, include_unfinished=False, best=["learning_rate"]
    )
    text = (tmp_path / "report" / "report.md").read_text()
    assert "- learning_rate=0.001 on Hopper-v4: lr1e-3_anneal (IQM 11.000) of 2 (the others: lr1e-3_constant 5.000)" in text
    assert "- learning_rate=0.001 on Walker2d-v4: lr1e-3_constant (IQM 8.000) of 2 (the others: lr1e-3_anneal 1.000)" in text
    assert "- learning_rate=0.0003 on Hopper-v4: lr3e-4_anneal (IQM 2.000) of 1 (the others: no other)" in text
    per_game = [line for line in text.splitlines() if line.startswith("| learning_rate=")][-2:]
    assert per_game == ["| learning_rate=0.0003 | 2.000 | 3.000 |", "| learning_rate=0.001 | 11.000 | 8.000 |"]


# --------------------------------------------------------------------------------------
# --heatmap FLAG_X FLAG_Y
# --------------------------------------------------------------------------------------


def test_heatmap_writes_each_cells_iqm_and_leaves_a_missing_cell_blank(aggregate, tmp_path):
    """ewma_com {1, 8} x clip_coef {0.1, 0.2} at 8 envs without the cell (8, 0.2), and one cell at 32 envs: a panel
    for each N_envs (not pooled over them), its missing cells blank; a standard PPO configuration (no ewma_com) is left
    out with a note. Procgen's normalised scores pool both games (IQM over runs x games)."""
    starpilot = lambda score: 2.5 + 61.5 * score  # noqa: E731 - starpilot's range [2.5, 64]; bigfish's [1, 40]
    cells = {(1.0, 0.1, 8): 0.2, (1.0, 0.2, 8): 0.4, (8.0, 0.1, 8): 0.6, (1.0, 0.1, 32): 0.8}
    for (com, clip, envs), score in cells.items():
        config = f"ewma_com{com:g}_clip{clip}_envs{envs}"
        for game, value in (("StarpilotEasy-v0", starpilot(score)), ("BigfishEasy-v0", 1 + 39 * 0.5)):
            write_run(
                str(tmp_path),
                game,
                config,
                1,
                returns_at([4000], [value]),
                ewma_com=com,
                clip_coef=clip,
                num_envs=envs,
                planned_steps=4096,
            )
    for game in ("StarpilotEasy-v0", "BigfishEasy-v0"):
        write_run(str(tmp_path), game, "ppo", 1, returns_at([4000], [10.0]), clip_coef=0.1)
    heatmap = ("ewma_com", "clip-coef")  # a flag as written on the command line is args.json's
    aggregate.report(
        str(tmp_path), str(tmp_path / "report"), 0.5, 4, 100, pdf=False, include_unfinished=False, heatmap=heatmap
    )
    text = (tmp_path / "report" / "report.md").read_text()
    assert "\n- num_envs = 8: ewma_com=8, clip_coef=0.2: no run (blank)" in text
    assert "\n- num_envs = 32: ewma_com=8, clip_coef=0.1: no run (blank)" in text
    assert "\n- ppo: no ewma_com in its args.json: left out of the heatmap" in text
    panels = {}
    for title in ("all games, num_envs = 8", "all games, num_envs = 32"):
        panels[title] = text.split(f"{title}: IQM final normalised return, rows clip_coef, columns ewma_com\n\n")[
            1
        ].splitlines()[:4]
    assert panels["all games, num_envs = 8"] == [
        "| clip_coef \\ ewma_com | 1 | 8 |",
        "|---|---|---|",
        "| 0.1 | 0.350 | 0.550 |",  # the IQM of two scores: their mean (0.2 on starpilot, 0.5 on bigfish)
        "| 0.2 | 0.450 |  |",
    ]
    assert panels["all games, num_envs = 32"][2:] == ["| 0.1 | 0.650 |  |", "| 0.2 |  |  |"]
    figure = aggregate.figures["heatmap_ewma_com_clip_coef.png"]
    assert [axis.get_title() for axis in figure.axes if axis.get_xlabel()] == list(panels)
    assert sorted(text.get_text() for text in figure.axes[0].texts) == ["0.35", "0.45", "0.55"]  # blank: no number


# --------------------------------------------------------------------------------------
# score_vs_batch.png, ddr_vs_score_by_budget.png, sps_vs_num_envs.png
# --------------------------------------------------------------------------------------


def test_batch_multiplier_draws_the_n_envs_and_n_ro_lines_from_the_shared_base(aggregate, tmp_path):
    """The data-scaling sweep down to 4 envs: (4, 8, 16, 32) x 128 and 8 x (256, 512); the base (8, 128) is on both
    lines; k = batch / 512. The epochs-4 family has one N_envs line only."""
    shapes = [(4, 128, 1.0), (8, 128, 2.0), (16, 128, 3.0), (32, 128, 4.0), (8, 256, 5.0), (8, 512, 6.0)]
    for envs, steps, value in shapes:
        write_run(
            str(tmp_path),
            "Hopper-v4",
            f"ppo_envs{envs}_steps{steps}",
            1,
            returns_at([4096], [value]),
            num_envs=envs,
            num_steps=steps,
            planned_steps=4096,
        )
    for envs in (8, 16):
        name = f"ppo_envs{envs}_steps128_epochs8"
        write_run(str(tmp_path), "Hopper-v4", name, 1, returns_at([4096], [7.0]), num_envs=envs, planned_steps=4096)
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.5, 4, 100, pdf=False, include_unfinished=False)
    axis = aggregate.figures["score_vs_batch.png"].axes[0]
    lines = {container.get_label(): list(container.lines[0].get_xydata().tolist()) for container in axis.containers}
    assert lines == {
        "ppo: N_envs x k (N_RO = 128)": [[1, 1], [2, 2], [4, 3], [8, 4]],
        "ppo: N_RO x k (N_envs = 8)": [[2, 2], [4, 5], [8, 6]],
        "ppo_epochs8: N_envs x k (N_RO = 128)": [[2, 7], [4, 7]],
    }
    assert axis.get_xlabel() == "batch multiplier k (batch / 512)"
    text = (tmp_path / "report" / "report.md").read_text()
    assert "\n- ppo: N_RO x k (N_envs = 8): ppo_envs8_steps128, ppo_envs8_steps256, ppo_envs8_steps512\n" in text


def test_ddr_against_score_is_coloured_by_budget_on_a_log_scale_past_10x(aggregate, tmp_path):
    """Runs of 4096 and 65,536 steps (16x): a point per run at (median DDR, score), coloured by the budget, log scale;
    one budget only: not drawn, and the report says why."""
    from matplotlib.colors import LogNorm

    for budget, ddr, value in ((4096, 1e3, 1.0), (65_536, 1e5, 2.0)):
        events = [(1000.0, step, {"metrics/ddr": ddr, "charts/episodic_return": value}) for step in (budget // 2, budget)]
        write_run(str(tmp_path), "Hopper-v4", f"ppo_{budget}", 1, events, planned_steps=budget, total_timesteps=budget)
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.5, 4, 100, pdf=False, include_unfinished=False)
    axis = aggregate.figures["ddr_vs_score_by_budget.png"].axes[0]
    dots = axis.collections[0]
    assert dots.get_offsets().tolist() == [[1e3, 1.0], [1e5, 2.0]] and dots.get_array().tolist() == [4096, 65536]
    assert isinstance(dots.norm, LogNorm) and axis.get_ylabel() == "final return"
    assert (
        "colour = its total_timesteps (2 budgets, 4,096 to 65,536: log scale)"
        in (tmp_path / "report" / "report.md").read_text()
    )
    os.remove(
        next(
            os.path.join(root, "done.json")
            for root, _, files in os.walk(tmp_path)
            if "ppo_65536" in root and "done.json" in files
        )
    )
    aggregate.figures.clear()
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.5, 4, 100, pdf=False, include_unfinished=False)
    assert "ddr_vs_score_by_budget.png" not in aggregate.figures
    assert "ddr_vs_score_by_budget.png not drawn: one budget (4,096 steps)." in (tmp_path / "report" / "report.md").read_text()


def test_steps_per_second_are_each_runs_median_after_its_first_fifth_of_points(aggregate, tmp_path):
    """charts/SPS of 10 (the start's compilation) then 100s: a run's median leaves the first fifth out; a configuration
    is the median of its runs; a line joins the N_envs of a family."""
    rates = {("ppo_envs8", 1): [10, 100, 100, 100, 120], ("ppo_envs8", 2): [10, 200, 200, 200, 200]}
    rates |= {("ppo_envs16", 1): [10, 400, 400, 400, 400]}
    for (config, seed), values in rates.items():
        events = [
            (1000.0 + i, 1024 * (i + 1), {"charts/SPS": value, "charts/episodic_return": 1.0})
            for i, value in enumerate(values)
        ]
        write_run(str(tmp_path), "Hopper-v4", config, seed, events, num_envs=int(config[8:]), num_iterations=5)
    aggregate.report(str(tmp_path), str(tmp_path / "report"), 0.5, 4, 100, pdf=False, include_unfinished=False)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| ppo_envs8 | 8 | 2 | 150 |" in text and "| ppo_envs16 | 16 | 1 | 400 |" in text  # medians 100 and 200
    axis = aggregate.figures["sps_vs_num_envs.png"].axes[0]
    assert lines_of(axis) == {"ppo, N_RO = 128": ([8, 16], [150.0, 400.0])}


# --------------------------------------------------------------------------------------
# curves --metrics: the demo's picture
# --------------------------------------------------------------------------------------


def test_curves_metrics_draws_one_row_the_return_beside_the_studys_metrics(aggregate, monkeypatch, tmp_path, capsys):
    """A run that logged the return, feature rank and DDR: three panels in one row, the return smoothed, the metrics
    as logged; each metric that the run did not log is left out with a printed note."""
    events = [(1000.0 + i, 1024 * i, {"metrics/feature_rank": 30.0 - i, "metrics/ddr": 10.0**i}) for i in (1, 2, 3)]
    events += returns_at([1000, 2000, 3000], [1.0, 3.0, 5.0])
    run_dir = write_run(str(tmp_path), "Breakout-v5", "ppo", 1, events)
    run_main(aggregate, monkeypatch, "curves", run_dir, "--metrics", "--smooth", 2, "--out", tmp_path / "demo.png")
    figure = aggregate.figures["demo.png"]
    titles = [axis.get_title() for axis in figure.axes]
    assert titles == ["episodic return (moving average of 2)", "feature rank", "data-to-divergence ratio"]
    assert len({axis.get_position().y0 for axis in figure.axes}) == 1  # one row
    assert [list(data) for data in lines_of(figure.axes[0])["Breakout-v5__ppo__1__100"]] == [
        [1000, 2000, 3000],
        [1.0, 2.0, 4.0],
    ]
    assert lines_of(figure.axes[1])["Breakout-v5__ppo__1__100"] == ([1024, 2048, 3072], [29.0, 28.0, 27.0])
    assert figure.axes[2].get_yscale() == "log"
    out = capsys.readouterr().out
    for tag in ("dormant_pct", "weight_norm", "grad_kurtosis", "kl_behavior"):
        assert f"note: no run logged metrics/{tag}: its panel is left out" in out


# --------------------------------------------------------------------------------------
# Bad values: one line, exit 2
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, error",
    [
        (["report", "SWEEP", "--best", "learning_rat"], "error: --best learning_rat: no run has that flag in its args.json;"),
        (["report", "SWEEP", "--heatmap", "ewma_com", "clip_coef"], "error: --heatmap ewma_com: no run has that flag"),
        (["report", "SWEEP", "--heatmap", "clip_coef", "clip-coef"], "error: --heatmap clip_coef clip-coef: give two"),
        (["report", "SWEEP", "--x", "seconds"], "error: --x seconds: give steps, updates or time"),
        (["report", "SWEEP", "--score", "best"], "error: --score best: give final or max"),
        (["report", "SWEEP", "--x", "time"], "error: --x time: no run has wall times in its event files"),
        (["curves", "RUN", "--x", "time"], "error: --x time: no run has wall times in its event files"),
        (["curves", "BARE", "--x", "updates"], "error: --x updates: no run's args.json has its batch_size, update_epochs"),
        (["curves", "RUN", "--metrics", "--tag", "charts/SPS"], "error: --metrics draws the return and the metrics' tags"),
    ],
)
def test_bad_modes_are_refused_in_one_line(aggregate, monkeypatch, capsys, tmp_path, arguments, error):
    """The runs' events carry no wall time (a tool that wrote none); a run directory without args.json has no updates."""
    run_dir = write_run(str(tmp_path / "sweep"), "Hopper-v4", "ppo", 1, returns_at([4096], [1.0], wall=0.0), clip_coef=0.1)
    os.remove(next(os.path.join(run_dir, name) for name in os.listdir(run_dir) if name.startswith("events")))
    write_events(run_dir, returns_at([4096], [1.0], wall=0.0), first_wall=0.0)
    bare = str(tmp_path / "bare")
    write_events(bare, returns_at([4096], [1.0]))
    paths = {"SWEEP": str(tmp_path / "sweep"), "RUN": run_dir, "BARE": bare}
    monkeypatch.chdir(tmp_path)  # curves' default --out: nothing may be written there either
    argv = [AGGREGATE, *(paths.get(argument, argument) for argument in arguments)]
    assert usage_error(aggregate.main, monkeypatch, capsys, argv).startswith(error)
    assert not os.path.exists(tmp_path / "sweep" / "report")
