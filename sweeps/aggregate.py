"""Turn the run directories of a sweep into the paper's figures and a markdown table.

    python sweeps/aggregate.py report runs/fixed_budget          # -> runs/fixed_budget/report/
    python sweeps/aggregate.py coverage runs/coverage            # -> runs/coverage/report/
    python sweeps/aggregate.py curves runs/Breakout-v5__ppo_atari_envpool__1__* --out curve.png

Subcommands:
  report    the finished runs under a sweep directory (those with done.json; --unfinished
            adds the rest; one run per configuration, game and seed), grouped by configuration
            (the run's --exp-name, which the sweep scripts set) and game (--env-id). Writes
            per-game learning curves (mean and 95 % CI over seeds), the median, IQM, mean and
            optimality gap of final scores with 95 % stratified bootstrap CIs (Agarwal et al.
            2021, `rliable`; a table and a figure), performance profiles, with --baseline the
            probability of improvement of each configuration over that one, IQM curves over
            training, metric curves (every metrics/ tag; with several games also one figure a game, its score
            first, as the paper's Fig. 3 and 10), final IQM against N_envs, final score
            against the data-to-divergence ratio (DDR), and report.md with the numbers. When every configuration
            is left out of the aggregate (each with a data note), only the curves: exit status 1.
  coverage  state-space coverage (paper Fig. 2, 9; Appendix B.7): the embeddings.npz of
            runs made with --save-embeddings, projected to 2-D with UMAP (one projection per
            game, fitted on all its runs), rescaled to [0, 1]^2; Cvg = occupied cells of a
            G x G grid / G^2 per run. Scatter plots coloured by the critic's value, coverage.md.
  curves    learning curve of one tag for a few run directories, one line per run; with --metrics one row of
            panels, the episodic return beside the study's metrics (the main study's Fig. 3; `make demo` draws it).

Modes (each printed, and listed in report.md under "How this report was made"):
  --x steps|updates|time  the curves' x-axis: environment steps; policy updates (gradient steps = iterations x
            update_epochs x minibatches, from args.json); wall-clock time of training (a resumed run's pause left out).
  --score final|max       a run's score: the mean of the episodes in the last --final-fraction of its steps, or the
            highest such windowed mean over training (the follow-up study's Fig. 8 plots the maximum).
  --best FLAG [FLAG ...]  per game and value of FLAG (or combination), only the configuration with the highest IQM
            over seeds (the follow-up study's Fig. 4: the best run per learning rate).
  --heatmap FLAG_X FLAG_Y the IQM score of each cell of two swept flags, written in the cells (the follow-up's Fig. 12b).
The report also draws, where the sweep has the data: score_vs_batch.png (the batch grown by N_envs or by N_RO, against
k = batch / the smallest batch: the main study's Figs. 1b, 7, 8, 14, 16), ddr_vs_score_by_budget.png (a point per run,
coloured by its total_timesteps, when the runs have several budgets: the follow-up's Fig. 8) and sps_vs_num_envs.png
(charts/SPS against N_envs: the follow-up's Fig. 14).

Scores: Atari games (the 57, DQN Zoo's random/human constants in metrics.py) are human-normalised,
Procgen easy-mode games normalised with (R - R_min) / (R_max - R_min), other tasks
(MuJoCo, Isaac Gym) stay raw returns (a data note when they are pooled with normalised games). A run's final
score is the mean over the episodes that end in the last --final-fraction of its training steps. A Kinetix run
(ppo_kinetix.py, env_id Kinetix-<task set>-<size>) scores its solve rate instead of a return: charts/solve_rate, the
fraction of its training tasks solved, already in [0, 1] (not normalised), its final score the mean of the
evaluations in that last fraction (a data note when it is pooled with other games' scores).

Event files are read record by record with both CRCs of the TFRecord framing checked: a damaged record is dropped with a
data note naming the file (--strict: exit 1), never read as another value.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import glob
import io
import json
import math
import multiprocessing
import os
import re
import sys
import tempfile
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import metrics  # noqa: E402 - the shared measurements (IQM, score tables), one directory up

RETURN_TAG = "charts/episodic_return"
SOLVE_RATE_TAG = "charts/solve_rate"  # a Kinetix run's score: the fraction of its training tasks solved
METRIC_TITLES = {
    "metrics/feature_rank": "feature rank",
    "metrics/feature_rank_critic": "feature rank (critic)",
    "metrics/dormant_pct": "dormant neurons (%)",
    "metrics/weight_norm": "weight norm",
    "metrics/grad_kurtosis": "gradient kurtosis",
    "metrics/grad_norm": "gradient norm",
    "metrics/ess_pct": "effective sample size (%)",
    "metrics/policy_variance": "policy variance",
    "metrics/kl_behavior": "KL(behaviour || updated policy)",
    "metrics/ddr": "data-to-divergence ratio",
    "metrics/kl_prox": "KL(proximal || policy)",
    "metrics/q_mean": "mean max Q",
    "charts/num_envs": "N_envs (--schedule)",
    "charts/clip_coef": "clip epsilon (--target-ddr)",
    "charts/ewma_com": "EWMA centre of mass (--adapt ewma-com)",
}
SCHEDULE_TAGS = ("charts/num_envs", "charts/clip_coef", "charts/ewma_com")  # plotted when they change during training


# --------------------------------------------------------------------------------------
# Reading runs
# --------------------------------------------------------------------------------------


# Every datum that the aggregation leaves out or substitutes: a warning line on stderr as it is found, a list in
# report.md, and exit status 1 with --strict.
DATA_NOTES: list[str] = []


def data_note(run_dir: str, what: str) -> None:
    add_note(f"{os.path.basename(os.path.normpath(run_dir))}: {what}")


def add_note(note: str) -> None:
    if note not in DATA_NOTES:
        DATA_NOTES.append(note)
        print(f"warning: {note}", file=sys.stderr)


# CRC32C (Castagnoli), the checksum of TFRecord framing: the reflected polynomial 0x82F63B78, one table entry a byte value
CRC32C_TABLE = np.arange(256, dtype=np.uint32)
for _ in range(8):
    CRC32C_TABLE = np.where(CRC32C_TABLE & 1, (CRC32C_TABLE >> 1) ^ np.uint32(0x82F63B78), CRC32C_TABLE >> 1)
CRC32C_TABLE_LIST = CRC32C_TABLE.tolist()
LONG_RECORD = 4096  # bytes: a longer record (text, an image) is checked on its own, not in the vectorised loop


def masked_crc32c(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC32C of buffer[start : start + length] for each (start, length), as uint32. The records are
    checked together, one byte position at a time (numpy, a table lookup per byte): the cost of a loop over a record's
    bytes is paid once a file, not once a record. Records over LONG_RECORD bytes (the run's hyperparameter text) go
    through a Python loop each."""
    crcs = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    short = lengths <= LONG_RECORD
    order = np.flatnonzero(short)[np.argsort(-lengths[short], kind="stable")]  # longest first: the active ones a prefix
    first_bytes, sorted_lengths = starts[order], lengths[order]
    active_counts = len(order) - np.searchsorted(sorted_lengths[::-1], np.arange(sorted_lengths.max(initial=0)), "right")
    sorted_crcs = crcs[order]
    for j, active in enumerate(active_counts.tolist()):
        crc = sorted_crcs[:active]
        sorted_crcs[:active] = CRC32C_TABLE[(crc ^ buffer[first_bytes[:active] + j]) & 0xFF] ^ (crc >> 8)
    crcs[order] = sorted_crcs
    for i in np.flatnonzero(~short).tolist():
        crc = 0xFFFFFFFF
        for byte in buffer[starts[i] : starts[i] + lengths[i]].tobytes():
            crc = CRC32C_TABLE_LIST[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        crcs[i] = crc
    crcs ^= np.uint32(0xFFFFFFFF)
    return ((crcs >> 15) | (crcs << 17)) + np.uint32(0xA282EAD8)  # the mask (wraps around in uint32)


def uint32_at(buffer: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each offset of a byte buffer."""
    return buffer[offsets[:, None] + np.arange(4)].view("<u4").ravel()


def events_in(path: str):
    """The Events of an event file, in order. Each record is an 8-byte length, the length's masked CRC32C, the Event and
    the Event's masked CRC32C; both CRCs are checked (TensorBoard drops a damaged record too, silently). A record whose
    Event fails its CRC (e.g. a flipped bit: a return of 0.0 read as 2.0) is dropped with a data note; a length that fails
    its CRC, or a file that ends inside a record (the damage that a killed run leaves), ends the reading there with a
    note, as where the next record starts is lost with it."""
    from google.protobuf.message import DecodeError  # noqa: PLC0415 - TensorBoard's dependencies
    from tensorboard.compat.proto.event_pb2 import Event  # noqa: PLC0415

    with open(path, "rb") as f:
        data = f.read()
    heads, lengths, position = [], [], 0  # the framing, as the lengths give it; checked below
    while position + 12 <= len(data):
        length = int.from_bytes(data[position : position + 8], "little")
        if position + 16 + length > len(data):
            break
        heads.append(position)
        lengths.append(length)
        position += 16 + length
    buffer = np.frombuffer(data, dtype=np.uint8)
    heads, lengths = np.array(heads, dtype=np.int64), np.array(lengths, dtype=np.int64)
    framed = masked_crc32c(buffer, heads, np.full(len(heads), 8)) == uint32_at(buffer, heads + 8)
    if not framed.all():  # a damaged length: the records after it are not where it says
        unframed = int(np.argmin(framed))
        position, heads, lengths = int(heads[unframed]), heads[:unframed], lengths[:unframed]
    intact = masked_crc32c(buffer, heads + 12, lengths) == uint32_at(buffer, heads + 12 + lengths)
    file = os.path.basename(path)
    for head, length, ok in zip(heads.tolist(), lengths.tolist(), intact.tolist(), strict=True):
        if not ok:
            data_note(os.path.dirname(path), f"{file}: the record at byte {head:,} is damaged (CRC mismatch): dropped")
            continue
        try:
            event = Event.FromString(data[head + 12 : head + 12 + length])
        except DecodeError:  # intact, but not an Event (written by another tool)
            data_note(os.path.dirname(path), f"{file}: the record at byte {head:,} is no TensorBoard event: dropped")
            continue
        yield event
    if position != len(data):
        damage = f"{file} is damaged (cut short or unreadable from byte {position:,})"
        data_note(os.path.dirname(path), f"{damage}: only the events before it are read")


def read_scalars(run_dir: str, tags: set[str] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{tag: (steps, values)} over the event files of a run directory (`read_events` without the clock)."""
    return read_events(run_dir, tags)[0]


def read_events(run_dir: str, tags: set[str] | None = None) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple]:
    """{tag: (steps, values)} over the event files of a run directory, read as TensorBoard reads them: the files in
    order, and a resumed run's `purge_step` (a SessionLog START) hides the points that the interrupted run logged after
    its checkpoint. Read here, not by TensorBoard's EventAccumulator, which takes 5-6 times longer (benchmarks/read_events.py):
    a paper-scale sweep is hundreds of runs of a million points or more. Also the run's clock, (steps, seconds): see
    `session_clock`."""
    from tensorboard.compat.proto.event_pb2 import SessionLog  # noqa: PLC0415

    paths = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not paths:
        data_note(run_dir, "no TensorBoard event file: no data from this run")
    points: dict[str, list[tuple[int, float]]] = {}
    clock: list[tuple[int, float]] = []  # (step, seconds of training), increasing in both
    for path in paths:  # one event file a session: a resumed run writes a new one
        first_wall = purge_step = sps = None  # for session_clock
        ends, last = [], clock[-1][0] if clock else 0  # (step, wall time) of the events logged past every earlier step
        for event in events_in(path):
            if first_wall is None:
                first_wall = event.wall_time or None  # 0: a tool that wrote no time
            if event.session_log.status == SessionLog.START:  # purge_step: the resumed run logs these steps again
                points = {tag: [point for point in tag_points if point[0] < event.step] for tag, tag_points in points.items()}
                clock = [point for point in clock if point[0] < event.step]
                purge_step, last = event.step, clock[-1][0] if clock else 0
            if event.summary.value and event.step > last:  # an iteration's end (not an episode logged with it)
                ends.append((event.step, event.wall_time))
                last = event.step
            for value in event.summary.value:
                if value.WhichOneof("value") == "simple_value" and (tags is None or value.tag in tags):
                    points.setdefault(value.tag, []).append((event.step, value.simple_value))
                if sps is None and value.tag == "charts/SPS" and value.simple_value > 0:
                    sps = (event.step, event.wall_time, value.simple_value)
        clock += session_clock(first_wall, purge_step, sps, ends, clock)
    scalars = {}
    for tag, tag_points in points.items():
        tag_points.sort(key=lambda point: point[0])  # stable: episodes of one step keep their order
        steps, values = np.array([p[0] for p in tag_points], dtype=np.int64), np.array([p[1] for p in tag_points])
        if not (finite := np.isfinite(values)).all():  # e.g. an inf DDR (a KL of 0): no mean or curve would survive it
            data_note(run_dir, f"{(~finite).sum()} non-finite {tag} point(s) left out (first at step {steps[~finite][0]:,})")
        scalars[tag] = (steps[finite], values[finite])
    return scalars, (np.array([p[0] for p in clock], dtype=np.int64), np.array([p[1] for p in clock], dtype=float))


def session_clock(first_wall: float | None, purge_step: int | None, sps: tuple | None, ends: list, clock: list) -> list:
    """(step, seconds of training) at the iteration ends of one event file (a session of the run; `ends`: (step, wall
    time) of the events whose step is past every earlier one: an episode logged at an earlier step with its iteration's
    write is not one): the wall time minus the session's start, plus the seconds of the sessions before it up to the
    resumed checkpoint (`clock`, purged). The pause between sessions and the steps that an interrupted session trained
    after its checkpoint are not counted. A session starts at its file's first event (the writer opens with the run,
    before its environments are made); a resumed session opens its file at its first log, after its first iteration:
    its start is moved back by that iteration's steps / its first charts/SPS (`sps`: step, wall time, value), which
    counts from the session's start."""
    if first_wall is None:
        return []
    start = first_wall
    if purge_step is not None and sps is not None:  # a resumed session: the SPS of its first iteration dates its start
        start = min(start, sps[1] - (sps[0] - (purge_step - 1)) / sps[2])
    offset = clock[-1][1] if clock else 0.0
    seconds = np.maximum.accumulate([offset + wall - start for _, wall in ends]) if ends else []  # a clock never goes back
    return [(step, float(time)) for (step, wall), time in zip(ends, seconds, strict=True) if wall > 0]


def read_run(run_dir: str) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple, list[str]]:
    """`read_events` in a worker process of `load_runs`: its data notes come back with the scalars, unprinted."""
    DATA_NOTES.clear()  # the notes of the process that started this one
    with contextlib.redirect_stderr(io.StringIO()):
        return *read_events(run_dir), list(DATA_NOTES)


def load_runs(sweep_dir: str, include_unfinished: bool) -> list[dict]:
    """The runs of a sweep: their flags (args.json), identity and scalars."""
    runs, unfinished = [], 0
    for args_path in sorted(glob.glob(os.path.join(sweep_dir, "*", "args.json"))):
        run_dir = os.path.dirname(args_path)
        if not include_unfinished and not os.path.exists(os.path.join(run_dir, "done.json")):
            unfinished += 1
            continue
        try:
            with open(args_path) as f:
                args = json.load(f)
            identity = {"env_id": args["env_id"], "config": args["exp_name"], "seed": args["seed"]}
            total_steps = args.get("planned_steps") or args["num_iterations"] * args["batch_size"]
        except (OSError, ValueError, TypeError, KeyError) as error:  # e.g. written by hand, or by another tool
            data_note(run_dir, f"args.json unreadable ({type(error).__name__}: {error}): the run is left out")
            continue
        runs.append({"dir": run_dir, "args": args, **identity, "total_steps": total_steps})
    # Reading the event files is most of a paper-scale report's time (benchmarks/read_events.py): a process per core
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # a Slurm job's
    dirs = [run["dir"] for run in runs]
    # Forked workers start fastest, but a fork of a process with JAX's threads (one that imported ppo_kinetix.py, e.g. a
    # test session) can deadlock: those get workers from a fork server, which has no such threads
    try:
        start = multiprocessing.get_context("forkserver" if "jax" in sys.modules else None)
        pool = concurrent.futures.ProcessPoolExecutor(max(1, min(len(runs), cores)), start)
    except (NotImplementedError, OSError, ValueError):  # no POSIX semaphores (some containers), no fork server (ValueError):
        pool = None  # the runs are read in this process
    with pool or contextlib.nullcontext():
        read = pool.map(read_run, dirs) if pool else ((*read_events(run_dir), []) for run_dir in dirs)
        for run, (scalars, clock, notes) in zip(runs, read, strict=True):
            run["scalars"], run["clock"] = scalars, clock
            for note in notes:  # noted here, in the runs' order
                add_note(note)
    if unfinished:
        print(f"note: {unfinished} run(s) without done.json left out (still running or interrupted; --unfinished adds them)")

    # One run per configuration, game and seed: a crashed run that launch.sh started again, or a run repeated by hand, is
    # not another seed. Kept: a finished one, else the one that got furthest, else the newest (the time in its name).
    def identity(run: dict) -> tuple:
        return run["config"], run["env_id"], run["seed"]

    best: dict[tuple, tuple] = {}  # identity -> (rank, run)
    for run in runs:
        last_step = max((steps[-1] for steps, _ in run["scalars"].values() if len(steps)), default=0)
        rank = (os.path.exists(os.path.join(run["dir"], "done.json")), last_step, run["dir"])
        if identity(run) not in best or rank > best[identity(run)][0]:
            best[identity(run)] = (rank, run)
    for run in runs:
        if (kept := best[identity(run)][1]) is not run:
            data_note(run["dir"], f"left out: same configuration, game and seed as {os.path.basename(kept['dir'])}")
    return [run for _, run in best.values()]


def is_kinetix(run: dict) -> bool:
    """A run of ppo_kinetix.py (or of a Kinetix task): its score is the solve rate, not the return."""
    return run["args"].get("script") == "ppo_kinetix.py" or run["env_id"].startswith("Kinetix-")


def score_tag(run: dict) -> str:
    """The tag of a run's score: the solve rate of a Kinetix run, the episodic return of the others."""
    return SOLVE_RATE_TAG if is_kinetix(run) else RETURN_TAG


def score_kind(run: dict) -> str:
    """What a run's score is: "solve rate" (Kinetix, in [0, 1] as logged), else the kind of `normalise`."""
    return "solve rate" if is_kinetix(run) else normalise(run["env_id"], np.zeros(1))[1]


def run_scores(run: dict, values: np.ndarray) -> np.ndarray:
    """The run's logged score values (of its `score_tag`) as scores: a solve rate as is, returns normalised."""
    return values if is_kinetix(run) else normalise(run["env_id"], values)[0]


def score_label(runs: list[dict]) -> str:
    kinds = {score_kind(run) for run in runs}
    return kinds.pop() if len(kinds) == 1 else "score"


def normalise(env_id: str, returns: np.ndarray) -> tuple[np.ndarray, str]:
    """Human-normalised (Atari), normalised (Procgen easy) or raw returns, and what they are."""
    try:
        return metrics.human_normalized_score(env_id, returns), "human-normalised score"
    except KeyError:
        pass
    try:
        return metrics.procgen_normalized_score(env_id, returns), "normalised return"
    except KeyError:
        return returns, "return"


def final_score(run: dict, final_fraction: float, score: str = "final") -> float:
    """Mean normalised return of the episodes ending in the last `final_fraction` of training (a Kinetix run: mean
    solve rate of the evaluations there). With `score` "max": the maximum over training of that windowed mean (see
    `max_window_mean`; the last window is one of them)."""
    steps, returns = run["scalars"].get(score_tag(run), (np.zeros(0), np.zeros(0)))
    window = returns[steps > (1.0 - final_fraction) * run["total_steps"]]
    if len(window) == 0 and len(returns):
        last = "its last solve rate scores" if is_kinetix(run) else "its last 10 episodes score"
        what = "no solve rate was evaluated" if is_kinetix(run) else "no episode ended"
        data_note(run["dir"], f"{what} in the last {final_fraction:.0%} of the steps: {last}")
        window = returns[-1:] if is_kinetix(run) else returns[-10:]
    elif len(window) == 0:
        what = f"no finite {SOLVE_RATE_TAG}" if is_kinetix(run) else "no episode ended with a finite return"
        data_note(run["dir"], f"{what}: no final score (left out of the aggregate)")
    final = float(run_scores(run, window).mean()) if len(window) else float("nan")
    if score == "max" and len(window):
        return max(final, max_window_mean(steps, run_scores(run, returns), final_fraction * run["total_steps"]))
    return final


def max_window_mean(steps: np.ndarray, scores: np.ndarray, width: float) -> float:
    """The highest mean of the scores in a window (t - width, t] of the steps, over the windows that end at a score's
    step t >= width (inside training: an early window with the run's first few episodes is not one); -inf without
    one. The steps are sorted (read_events sorts them)."""
    sums = np.concatenate([[0.0], np.cumsum(scores)])
    ends = np.searchsorted(steps, steps, side="right")  # a window ends after the last score of its step
    starts = np.searchsorted(steps, steps - width, side="right")
    inside = steps >= width
    means = (sums[ends] - sums[starts])[inside] / (ends - starts)[inside]
    return float(means.max()) if len(means) else -math.inf


def last_step(run: dict) -> float:
    """The last step the run logged anything at (or its x on another axis: `on_x_axis`)."""
    return max((steps[-1].item() for steps, _ in run["scalars"].values() if len(steps)), default=0)


def score_curve(run: dict, grid: np.ndarray) -> np.ndarray:
    """Mean normalised return of the episodes ending in each interval (grid[i-1], grid[i]] (a Kinetix run: mean solve
    rate of the evaluations there); an interval without episodes repeats the previous value; NaN (a gap) before the
    run's first episode and past its last logged step."""
    steps, returns = run["scalars"].get(score_tag(run), (np.zeros(0), np.zeros(0)))
    scores = run_scores(run, returns)
    curve = np.full(len(grid), np.nan)
    edges = np.concatenate([[-1], grid])
    for i in range(len(grid)):
        inside = (steps > edges[i]) & (steps <= edges[i + 1])
        if inside.any():
            curve[i] = scores[inside].mean()
    previous = np.nan
    for i in range(len(curve)):
        if np.isnan(curve[i]):
            curve[i] = previous
        previous = curve[i]
    curve[edges[:-1] >= last_step(run)] = np.nan  # the intervals that start after it
    return curve


def run_ddr(run: dict) -> float | None:
    """The run's data-to-divergence ratio: the median of its metrics/ddr over training (not the mean: the annealed LR's
    last KLs near 0 would rule it); None without one."""
    values = run["scalars"].get("metrics/ddr", ((), ()))[1]
    return float(np.median(values)) if len(values) else None


def numbers_as_numbers(name: str) -> list:
    """A sort key that orders ppo_envs8 < ppo_envs16 < ppo_envs128 (as text: 128 < 16 < 8), lr0.25 < lr0.5."""
    parts = re.split(r"([0-9]+(?:\.[0-9]+)?)", name)  # the odd parts are the numbers
    return [(0, float(part), "") if i % 2 else (1, 0.0, part) for i, part in enumerate(parts)]


def group_runs(runs: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """{configuration: {game: [runs sorted by seed]}}."""
    groups: dict[str, dict[str, list[dict]]] = {}
    for run in runs:
        groups.setdefault(run["config"], {}).setdefault(run["env_id"], []).append(run)
    for games in groups.values():
        for game_runs in games.values():
            game_runs.sort(key=lambda run: run["seed"])
    return groups


def score_matrices(groups: dict, games: list[str], final_fraction: float, score: str = "final") -> tuple[dict, dict]:
    """rliable's input: {configuration: (runs, games) final scores}, and {configuration: {game: [the runs in it]}};
    seeds aligned per game by rank, truncated to the smallest count; configurations missing a game are left out. A run
    without a final score (nan, which final_score notes) and the runs that the truncation drops (noted here) are left out."""
    matrices, kept = {}, {}
    for config, by_game in groups.items():
        missing = [game for game in games if game not in by_game]
        if missing:
            data_note(config, f"no run on {', '.join(missing)}: left out of the aggregate")
            continue
        scored = {game: [(run, final_score(run, final_fraction, score)) for run in by_game[game]] for game in games}
        for game in games:  # final_score noted the runs without one
            scored[game] = [(run, score) for run, score in scored[game] if not np.isnan(score)]
        num_runs = min(len(scored[game]) for game in games)
        if num_runs == 0:
            data_note(config, "no final score on a game: left out of the aggregate")
            continue
        for game in games:
            for run, _ in scored[game][num_runs:]:
                data_note(run["dir"], f"left out of the aggregate: {config} has {num_runs} scored run(s) on another game")
        matrices[config] = np.array([[scored[game][i][1] for game in games] for i in range(num_runs)])
        kept[config] = {game: [run for run, _ in scored[game][:num_runs]] for game in games}
    return matrices, kept


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean over every entry (a 25 % trimmed mean), as rliable computes it."""
    from rliable import metrics as rliable_metrics  # noqa: PLC0415

    return float(rliable_metrics.aggregate_iqm(scores))


AGGREGATE_NAMES = ("median", "IQM", "mean", "optimality gap")


def aggregate_metrics(scores: np.ndarray, normalised: bool) -> np.ndarray:
    """rliable's four aggregates of a (runs, games) matrix of final scores, in AGGREGATE_NAMES' order: the median and the
    mean over games of each game's mean over runs, the IQM over all runs x games, and, for normalised scores only, the
    optimality gap: the mean shortfall below 1 (human level on Atari, the maximum on Procgen, every task solved on Kinetix;
    a score above 1 counts as 1), lower is better. Raw returns have no such level: three values."""
    from rliable import metrics as rliable_metrics  # noqa: PLC0415

    values = [rliable_metrics.aggregate_median(scores), iqm(scores), rliable_metrics.aggregate_mean(scores)]
    if normalised:
        values.append(rliable_metrics.aggregate_optimality_gap(scores, gamma=1.0))
    return np.array(values, dtype=float)


def score_distribution(scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """rliable's performance profile: the fraction of all runs x games whose final score is above each threshold."""
    return (scores[..., None] > thresholds).mean(axis=(0, 1))


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """rliable's P(X > Y) of two (runs, games) matrices of final scores (the run counts may differ): per game, the
    probability that a run of X drawn at random scores above one of Y (Mann-Whitney's U / (n_x n_y): a tie counts
    half), averaged over games. Agarwal et al. 2021 read X as better when the CI's lower bound is above 0.5. Every pair
    compared at once, in numpy: rliable's own function (a scipy call per game) made the bootstrap about 20 times slower."""
    pairs = scores_x[:, None, :] - scores_y[None, :, :]  # (runs of X, runs of Y, games)
    return float(((pairs > 0) + 0.5 * (pairs == 0)).mean())


def interval_estimates(matrices: dict[str, np.ndarray | tuple], func, reps: int, seed: int = 0):
    """Point estimates and 95 % stratified bootstrap CIs (rliable), reproducible: each configuration's from the same
    seed, so that its CI does not depend on which configurations come before it. A pair of matrices (X, Y) is
    resampled independently, each within its games, for a statistic of two (`probability_of_improvement`)."""
    from rliable import library as rly  # noqa: PLC0415

    estimates, intervals = {}, {}
    for config, matrix in matrices.items():
        np.random.seed(seed)  # rliable 1.2's stratified bootstrap draws from numpy's global RNG, not random_state
        with warnings.catch_warnings():  # rliable 1.2 passes arch's deprecated random_state
            warnings.simplefilter("ignore", FutureWarning)
            estimate, interval = rly.get_interval_estimates(
                {config: matrix}, func, reps=reps, random_state=np.random.RandomState(seed)
            )
        estimates |= estimate
        intervals |= interval
    return estimates, intervals


# --------------------------------------------------------------------------------------
# The report's modes: the x-axis, the best configuration per group, the heatmap's cells
# --------------------------------------------------------------------------------------

X_LABELS = {"steps": "environment steps", "updates": "policy updates (gradient steps)", "time": "wall-clock time"}
X_METHODS = {
    "steps": "environment steps (the steps the events are logged at)",
    "updates": "policy updates: gradient steps = iterations x update_epochs x minibatches, from each run's args.json (an "
    "iteration of B steps with minibatches of M states makes update_epochs x B / M; per --schedule phase where the run "
    "has phases; PQN's update_epochs and minibatches alike), linear between iterations; epochs that --target-kl stops "
    "early are counted (planned, not logged)",
    "time": "wall-clock time of training: each event's wall time minus its session's first event (the run's writer, "
    "opened before its environments); a resumed run's sessions (one event file each) are chained: the pause between "
    "them and the steps that the interrupted session trained after its checkpoint are not counted, and a resumed "
    "session's start is dated back by its first iteration (its steps / its charts/SPS)",
}
TIME_UNITS = ((3 * 3600, 3600, "hours"), (180, 60, "minutes"), (0, 1, "seconds"))  # the first whose threshold is passed


def update_knots(args: dict) -> tuple[np.ndarray, np.ndarray]:
    """(steps, updates): the policy updates done by each of the run's iteration ends, at the phase changes; the map is
    linear between them. The phases are args.json's (first step, N_envs, N_RO, minibatch size), as the Atari scripts'
    plan_iterations counts them, else the one batch with its minibatch size (or batch / num_minibatches)."""
    batch = args["batch_size"]
    minibatch = args.get("minibatch_size") or batch // args["num_minibatches"]
    phases = args.get("phases") or [(0, args["num_envs"], args["num_steps"], minibatch)]
    planned = args.get("planned_steps") or args["num_iterations"] * batch
    steps, updates = [0], [0.0]
    ends = [phase[0] for phase in phases[1:]] + [math.inf]  # a phase trains the iterations that start in it
    for (first, num_envs, num_steps, minibatch_size), end in zip(phases, ends, strict=True):
        phase_batch = num_envs * num_steps
        fit = (planned - steps[-1]) // phase_batch
        before_end = fit if end == math.inf else -((steps[-1] - end) // phase_batch)  # iterations starting in it
        iterations = min(fit, before_end) if steps[-1] >= first else 0
        steps.append(steps[-1] + iterations * phase_batch)
        updates.append(updates[-1] + iterations * args["update_epochs"] * phase_batch / minibatch_size)
    return np.array(steps), np.array(updates)


def x_map(run: dict, x: str):
    """The function from the run's steps to its x (steps, updates or seconds); None, with a note, when the run lacks
    what it needs (an args.json with its batch and epochs; wall times in its event file)."""
    if x == "steps":
        return lambda steps: np.asarray(steps, dtype=float)
    if x == "updates":
        try:
            knots = update_knots(run["args"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            data_note(run["dir"], f"no update count in args.json ({type(error).__name__}: {error}): left out of the curves")
            return None
        return lambda steps: np.interp(steps, *knots)
    clock_steps, seconds = run.get("clock", ((), ()))
    if len(clock_steps) == 0:
        data_note(run["dir"], "no wall time in its event file: left out of the curves over time")
        return None
    if clock_steps[0] > 0:  # step 0 is the session's start
        clock_steps, seconds = np.concatenate([[0], clock_steps]), np.concatenate([[0.0], seconds])
    return lambda steps: np.interp(steps, clock_steps, seconds)


def on_x_axis(runs: list[dict], x: str) -> tuple[dict[int, dict], str]:
    """Each run (by id) with its scalars' steps replaced by x, and "x_end", the x of its planned last step (for time:
    its last clocked one), and the axis label. A run without an x keeps no scalar (its curves are gaps). Time is in
    seconds, minutes or hours, whichever reads best for the longest run."""
    maps = {id(run): x_map(run, x) for run in runs}
    ends = {id(run): 0.0 if f is None else float(f(run["total_steps"])) for run, f in ((r, maps[id(r)]) for r in runs)}
    unit, label = 1, X_LABELS[x]
    if x == "time":
        _, unit, name = next(unit for unit in TIME_UNITS if max(ends.values(), default=0) > unit[0])
        label = f"{label} ({name})"
    moved = {}
    for run in runs:
        f = maps[id(run)]
        scalars = {} if f is None else {tag: (f(steps) / unit, values) for tag, (steps, values) in run["scalars"].items()}
        moved[id(run)] = run | {"scalars": scalars, "x_end": ends[id(run)] / unit}
    return moved, label


def flag_name(text: str) -> str:
    """--learning-rate, learning-rate or learning_rate: args.json's learning_rate."""
    return text.lstrip("-").replace("-", "_")


def config_flag(by_game: dict[str, list[dict]], flag: str):
    """A configuration's value of an args.json flag (its first run's; absent: None; a list as a tuple: a key)."""
    value = next(run for game_runs in by_game.values() for run in game_runs)["args"].get(flag)
    return tuple(value) if isinstance(value, list) else value


def check_flags(runs: list[dict], flags: list[str], option: str) -> None:
    """Every flag must be one that some run's args.json has: else one line, exit 2."""
    known = sorted({name for run in runs for name in run["args"]})
    for flag in flags:
        if flag_name(flag) not in known:
            sys.stderr.write(
                f"error: {option} {flag}: no run has that flag in its args.json; their flags: {', '.join(known)}\n"
            )
            sys.exit(2)


def value_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def best_per_value(groups: dict, flags: list[str], final_fraction: float, score: str) -> tuple[dict, list[str]]:
    """The follow-up study's Fig. 4, best run per LR: per game and per value of `flags` (one flag, or several: per
    combination), the configuration with the highest IQM (over seeds) of the game's scores among the configurations
    with that value, which differ in other flags. Returns {"flag=value": {game: that configuration's runs}} and a line
    per value and game saying which was kept, of which. A configuration without a flag (a data note) or without a score
    on a game is not a candidate there."""
    candidates: dict = {}  # value -> game -> [(IQM, configuration)]
    for config, by_game in groups.items():
        value = tuple(config_flag(by_game, flag) for flag in flags)
        if None in value:
            data_note(config, f"no {flags[value.index(None)]} in its args.json: left out of --best")
            continue
        for game, game_runs in by_game.items():
            scores = np.array([final_score(run, final_fraction, score) for run in game_runs])
            if np.isfinite(scores).any():
                scored = candidates.setdefault(value, {}).setdefault(game, [])
                scored.append((iqm(scores[np.isfinite(scores)][:, None]), config))
    best, lines = {}, []
    names = {
        value: " ".join(f"{flag}={value_text(part)}" for flag, part in zip(flags, value, strict=True)) for value in candidates
    }
    for value in sorted(candidates, key=lambda value: numbers_as_numbers(names[value])):
        for game, scored in sorted(candidates[value].items()):
            top, kept = max(scored, key=lambda pair: pair[0])  # the first of equals (the configurations' order)
            best.setdefault(names[value], {})[game] = groups[kept][game]
            others = ", ".join(f"{config} {iqm_value:.3f}" for iqm_value, config in scored if config != kept) or "no other"
            lines.append(f"{names[value]} on {game}: {kept} (IQM {top:.3f}) of {len(scored)} (the others: {others})")
    return best, lines


HEATMAP_SETTINGS = ("num_envs", "num_steps", "total_timesteps")  # a sweep's grid is often repeated at each: a panel each


def heatmap_cells(groups: dict, flags: tuple[str, str]) -> tuple[list, list, dict, list[str]]:
    """The heatmap's columns (values of flags[0]), rows (values of flags[1]) and {(setting, x, y): [configurations]},
    where a setting names the values of N_envs, N_RO and budget that differ between the configurations (a panel each:
    a grid searched at each batch is not pooled over them); and the notes: a configuration without either flag is left
    out (a data note), a cell of a setting with several configurations pools their runs, a missing cell is blank."""
    cells: dict[tuple, list[str]] = {}
    settings = {config: {name: config_flag(by_game, name) for name in HEATMAP_SETTINGS} for config, by_game in groups.items()}
    varying = [name for name in HEATMAP_SETTINGS if name not in flags and len({s[name] for s in settings.values()}) > 1]
    for config, by_game in groups.items():
        x, y = (config_flag(by_game, flag) for flag in flags)
        if x is None or y is None:
            data_note(config, f"no {flags[0] if x is None else flags[1]} in its args.json: left out of the heatmap")
            continue
        setting = ", ".join(f"{name} = {value_text(settings[config][name])}" for name in varying)
        cells.setdefault((setting, x, y), []).append(config)
    order = lambda values: sorted(set(values), key=lambda value: numbers_as_numbers(value_text(value)))  # noqa: E731
    columns, rows = order(x for _, x, _ in cells), order(y for _, _, y in cells)
    cell = lambda setting, x, y: f"{setting + ': ' if setting else ''}{flags[0]}={value_text(x)}, {flags[1]}={value_text(y)}"  # noqa: E731
    notes = [f"{cell(*key)}: pools {', '.join(configs)}" for key, configs in cells.items() if len(configs) > 1]
    for setting in order(setting for setting, _, _ in cells):
        notes += [f"{cell(setting, x, y)}: no run (blank)" for y in rows for x in columns if (setting, x, y) not in cells]
    return columns, rows, cells, notes


def batch_lines(summary: list[dict]) -> dict[str, list[dict]]:
    """The lines of the batch-multiplier figure (the main study's Figs. 1b, 7, 8, 14, 16: N_envs and N_RO scaled to the
    same batch): per family of configurations (the names without their envs<N>/steps<N> parts), one line of those that
    share the N_RO most of the family share (grown by N_envs) and one of those that share its most common N_envs
    (grown by N_RO); a configuration on both (the base) is on both. A line of one configuration is no line."""
    families: dict[str, list[dict]] = {}
    for row in summary:
        if not row["schedule"]:
            families.setdefault(envs_series(row["config"], "").strip(", ") or "all", []).append(row)
    lines = {}
    for family, rows in families.items():
        for grown, shared in (("N_envs", "num_steps"), ("N_RO", "num_envs")):
            values = [row[shared] for row in rows]
            common = max(sorted(set(values)), key=values.count)  # ties: the smallest
            line = sorted((row for row in rows if row[shared] == common), key=lambda row: row["batch_size"])
            if len(line) > 1:
                lines[f"{family}: {grown} x k ({'N_RO' if shared == 'num_steps' else 'N_envs'} = {common})"] = line
    return lines


def run_sps(run: dict) -> float | None:
    """A run's steps per second: the median of its charts/SPS after the first fifth of its points (each is the rate
    since the session's start: the first ones carry the start's compilation and warm-up); None without one."""
    values = run["scalars"].get("charts/SPS", ((), ()))[1]
    return float(np.median(values[len(values) // 5 :])) if len(values) else None


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------


def pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def save(figure, path: str, pdf: bool) -> None:
    if figure.get_layout_engine() is None:  # the coverage figure's shared colorbar needs matplotlib's constrained layout
        figure.tight_layout()
    figure.savefig(path, dpi=120)
    if pdf:
        figure.savefig(os.path.splitext(path)[0] + ".pdf")
    pyplot().close(figure)
    print(f"wrote {path}")


def mean_and_ci(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over axis 0 and the half-width of a 95 % Student-t interval, both over the runs that have a value at each
    point (NaN: a run not started or ended there); the half-width is 0 where one run has."""
    from scipy.stats import t  # noqa: PLC0415

    with warnings.catch_warnings():  # a point that no run has reached yet is NaN (a gap in the curve), not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, n = np.nanmean(curves, axis=0), np.isfinite(curves).sum(axis=0)
        half = t.ppf(0.975, np.maximum(n - 1, 1)) * np.nanstd(curves, axis=0, ddof=1) / np.sqrt(np.maximum(n, 1))
        return mean, np.where(n > 1, half, 0.0)


def config_colors(configs: list[str]) -> dict[str, tuple]:
    plt = pyplot()
    cmap = plt.get_cmap("tab10" if len(configs) <= 10 else "tab20")
    return {config: cmap(i % cmap.N) for i, config in enumerate(configs)}


def legend_below(figure, axes, title: str | None = None) -> None:
    """The legend of the lines of `axes` under the figure's panels: inside a panel, a dozen configurations hide its data.
    A line without a point (no run has data there) has no label."""
    entries = {label: handle for axis in axes for handle, label in zip(*axis.get_legend_handles_labels(), strict=True)}
    if not entries:
        return
    width, height = figure.get_size_inches()
    column = (4 * max(map(len, entries)) + 40) / 72  # inches: about 4 pt a character at 7 pt, and the line sample
    columns = max(1, min(len(entries), 4, int(width / column)))
    figure.set_size_inches(width, height + 0.16 * -(-len(entries) // columns))  # the panels keep their height
    options = dict(fontsize=7, title=title, title_fontsize=7, ncol=columns)
    figure.legend(entries.values(), entries.keys(), loc="outside lower center", **options)


def panel_grid(count: int):
    """A figure with `count` panels, 4 per row (the spare ones hidden), laid out by matplotlib's constrained layout,
    which keeps the title, colorbar and a legend below the panels clear of them."""
    columns = min(count, 4)
    rows = -(-count // columns)
    size = (max(4.2 * columns, 6.4), 3.2 * rows)
    figure, axes = pyplot().subplots(rows, columns, figsize=size, squeeze=False, layout="constrained")
    for axis in list(axes.flat)[count:]:
        axis.axis("off")
    return figure, axes


def plot_game_curves(groups, games, grid, colors, label, out, pdf, xlabel: str = X_LABELS["steps"]) -> None:
    figure, axes = panel_grid(len(games))
    for axis, game in zip(axes.flat, games, strict=False):
        for config, by_game in groups.items():
            if game not in by_game:
                continue
            mean, half = mean_and_ci(np.array([score_curve(run, grid) for run in by_game[game]]))
            seeds = f"{config} ({len(by_game[game])})" if np.isfinite(mean).any() else None
            axis.plot(grid, mean, color=colors[config], label=seeds, marker=".", markersize=3)
            axis.fill_between(grid, mean - half, mean + half, color=colors[config], alpha=0.2)
        axis.set_title(game)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    legend_below(figure, axes.flat, title="configuration (seeds)")
    figure.suptitle("Learning curves: mean and 95 % CI over seeds")
    save(figure, out, pdf)


def plot_iqm_curves(curve_matrices, grid, colors, label, reps, out, pdf, xlabel: str = X_LABELS["steps"]) -> None:
    plt = pyplot()

    def iqm_per_point(scores):  # a gap where a run has no score yet (or no more)
        return np.array(
            [iqm(scores[..., i]) if np.isfinite(scores[..., i]).all() else np.nan for i in range(scores.shape[-1])]
        )

    points, intervals = interval_estimates(curve_matrices, iqm_per_point, reps)
    figure, axis = plt.subplots(figsize=(6.4, 4), layout="constrained")
    for config in curve_matrices:
        line = config if np.isfinite(points[config]).any() else None  # (`label` is the score's name)
        axis.plot(grid, points[config], color=colors[config], label=line, marker=".", markersize=3)
        axis.fill_between(grid, intervals[config][0], intervals[config][1], color=colors[config], alpha=0.2)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(f"IQM {label}")
    axis.set_title("IQM over games and seeds (95 % stratified bootstrap CI)")
    axis.grid(alpha=0.3)
    legend_below(figure, [axis])
    save(figure, out, pdf)


def interpolate(grid: np.ndarray, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Linear interpolation at the grid's points; NaN (a gap) before the first logged step and at the points whose
    interval of the grid starts after the last (where np.interp would repeat the first or last value)."""
    previous = np.concatenate([[-np.inf], grid[:-1]])
    return np.where((grid >= steps[0]) & (previous < steps[-1]), np.interp(grid, steps, values), np.nan)


def plot_metric_curves(
    groups, grid, colors, out, pdf, game: str | None = None, label: str = "score", xlabel: str = X_LABELS["steps"]
) -> list[str]:
    """Every metrics/ tag (and the schedule's charts that change) over training: mean and 95 % CI over each
    configuration's runs, of every game together, or of one `game` with its `label` score first (the paper's Fig. 3 and
    10 show each game's dynamics beside its returns: metric values of different games are not averaged there)."""
    if game is not None:
        groups = {config: {game: by_game[game]} for config, by_game in groups.items() if game in by_game}
    runs = [run for by_game in groups.values() for game_runs in by_game.values() for run in game_runs]
    tags = sorted(
        {tag for run in runs for tag, (steps, _) in run["scalars"].items() if tag.startswith("metrics/") and len(steps)}
    )
    tags += [tag for tag in SCHEDULE_TAGS if any(len(set(run["scalars"].get(tag, ((), ()))[1])) > 1 for run in runs)]
    if not tags:
        return tags
    panels = ([RETURN_TAG] if game is not None else []) + tags
    figure, axes = panel_grid(len(panels))
    for axis, tag in zip(axes.flat, panels, strict=False):
        for config, by_game in groups.items():
            config_runs = [run for game_runs in by_game.values() for run in game_runs]
            if tag == RETURN_TAG:
                curves = [score_curve(run, grid) for run in config_runs]
            else:
                curves = [
                    interpolate(grid, *run["scalars"][tag]) for run in config_runs if len(run["scalars"].get(tag, ((), ()))[1])
                ]
            if not curves:
                continue
            mean, half = mean_and_ci(np.array(curves))
            line = config if np.isfinite(mean).any() else None
            axis.plot(grid, mean, color=colors[config], label=line, marker=".", markersize=3)
            axis.fill_between(grid, mean - half, mean + half, color=colors[config], alpha=0.2)
        axis.set_title(label if tag == RETURN_TAG else METRIC_TITLES.get(tag, tag.removeprefix("metrics/").replace("_", " ")))
        axis.set_xlabel(xlabel)
        axis.grid(alpha=0.3)
        if tag == "metrics/ddr":
            axis.set_yscale("log")
    legend_below(figure, axes.flat)
    figure.suptitle(f"Learning dynamics ({game or 'all games'}): mean and 95 % CI over runs")
    save(figure, out, pdf)
    return tags


def envs_series(config: str, shared: str) -> str:
    """The line of a configuration in the N_envs plot: configurations whose names differ only in their N_envs and N_RO
    parts (envs<N>, steps<N>, as the sweeps name runs) and that share N_RO (or the batch), e.g. ppo_envs8_epochs4 and
    ppo_envs16_epochs4; a configuration that differs in anything else (epochs, networks, LR, algorithm) has its own."""
    rest = re.sub(r"(^|_)(envs|steps)\d+(?=_|$)", "", config).strip("_")
    return f"{rest}, {shared}" if rest else shared


def score_series(summary: list[dict]) -> dict[str, list[dict]]:
    """The lines of the N_envs plot: per configuration and rollout length N_RO, or per batch size when that joins
    the points into fewer lines (the fixed-budget sweep: N_envs x N_RO = 1024, each N_RO once)."""
    groupings = []
    for shared in ("N_RO = {num_steps}", "batch = {batch_size}"):
        series: dict[str, list[dict]] = {}
        for row in summary:
            if not row["schedule"]:
                series.setdefault(envs_series(row["config"], shared.format(**row)), []).append(row)
        groupings.append(series)
    return min(groupings, key=len)  # the fewer lines (per N_RO on a tie)


def plot_score_vs_envs(summary, label, out, pdf) -> None:
    """Final IQM against N_envs, one line per series of `score_series` (the rebuttal's figure)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4), layout="constrained")
    series = score_series(summary)
    for name in sorted(series, key=lambda name: (min(row["num_steps"] for row in series[name]), name)):
        rows = sorted(series[name], key=lambda r: r["num_envs"])
        x = [row["num_envs"] for row in rows]
        y = np.array([row["iqm"] for row in rows])
        error = np.array([[row["iqm"] - row["ci"][0] for row in rows], [row["ci"][1] - row["iqm"] for row in rows]])
        axis.errorbar(x, y, yerr=error, marker="o", capsize=3, label=name)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("N_envs (parallel environments)")
    axis.set_ylabel(f"IQM {label}")
    axis.set_title("Performance vs N_envs (95 % CI)")
    axis.grid(alpha=0.3)
    legend_below(figure, [axis])
    save(figure, out, pdf)


def interval_bar(axis, position: int, estimate: float, ci, color) -> None:
    """rliable's interval estimate: a bar over the 95 % CI (none for a single run) and a black tick at the estimate."""
    if ci is not None:
        axis.barh(position, ci[1] - ci[0], left=ci[0], height=0.6, color=color, alpha=0.75)
    axis.vlines(estimate, position - 0.3, position + 0.3, color="black")


def plot_aggregate_metrics(summary, names, colors, label, out, pdf) -> None:
    """rliable's interval-estimate figure: a panel per aggregate, a bar per configuration over its 95 % CI and a black
    tick at the point estimate."""
    figure, axes = pyplot().subplots(
        1, len(names), figsize=(3 * len(names), 1.2 + 0.3 * len(summary)), sharey=True, squeeze=False, layout="constrained"
    )
    for axis, name, index in zip(axes[0], names, range(len(names)), strict=True):
        for position, row in enumerate(summary):
            ci = row["aggregate_cis"][index] if row["runs"] > 1 else None
            interval_bar(axis, position, row["aggregates"][index], ci, colors[row["config"]])
        axis.set_title(name)
        axis.set_xlabel(label)
        axis.grid(alpha=0.3, axis="x")
    axes[0][0].set_yticks(range(len(summary)), [row["config"] for row in summary])
    axes[0][0].invert_yaxis()  # the table's order, top to bottom
    figure.suptitle(f"Aggregates of the {label} (95 % stratified bootstrap CIs)")
    save(figure, out, pdf)


def plot_improvement(improvement, baseline, colors, out, pdf) -> None:
    """rliable's probability-of-improvement figure: a bar per configuration over the 95 % CI of P(X > baseline), a black
    tick at the point estimate, a dashed line at 0.5 (no better, no worse)."""
    figure, axis = pyplot().subplots(figsize=(6, 1.5 + 0.3 * len(improvement)), layout="constrained")
    for position, (config, (estimate, ci)) in enumerate(improvement.items()):
        interval_bar(axis, position, estimate, ci, colors[config])
    axis.axvline(0.5, color="gray", linestyle="--")
    axis.set_yticks(range(len(improvement)), list(improvement))
    axis.invert_yaxis()
    axis.set_xlim(0, 1)
    axis.set_xlabel(f"P(X > {baseline})")
    axis.set_title(f"Probability of improvement over\n{baseline} (95 % stratified bootstrap CIs)")
    axis.grid(alpha=0.3, axis="x")
    save(figure, out, pdf)


def plot_performance_profiles(matrices, colors, label, reps, out, pdf) -> None:
    """Score distributions (Agarwal et al. 2021, Fig. 5): a line per configuration with its 95 % bootstrap band."""
    highest = max(float(matrix.max()) for matrix in matrices.values())
    thresholds = np.linspace(min(0.0, *(float(matrix.min()) for matrix in matrices.values())), highest, 101)
    profiles, intervals = interval_estimates(matrices, lambda scores: score_distribution(scores, thresholds), reps)
    figure, axis = pyplot().subplots(figsize=(6.4, 4), layout="constrained")
    for config in matrices:
        axis.plot(thresholds, profiles[config], color=colors[config], label=config)
        axis.fill_between(thresholds, intervals[config][0], intervals[config][1], color=colors[config], alpha=0.2)
    axis.set_xlabel(f"{label} (tau)")
    axis.set_ylabel("fraction of runs with score > tau")
    axis.set_title("Performance profiles (95 % stratified bootstrap CIs)")
    axis.grid(alpha=0.3)
    legend_below(figure, [axis])
    save(figure, out, pdf)


def plot_ddr(groups, final_fraction, colors, label, out, pdf, score: str = "final") -> bool:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4), layout="constrained")
    plotted = False
    for config, by_game in groups.items():
        runs = [run for game_runs in by_game.values() for run in game_runs if run_ddr(run) is not None]
        points = [(run_ddr(run), final_score(run, final_fraction, score)) for run in runs]
        points = [(ddr, score) for ddr, score in points if np.isfinite(score)]  # final_score noted those without one
        if points:
            axis.scatter(*zip(*points, strict=True), color=colors[config], label=config, s=18)
            plotted = True
    if plotted:
        axis.set_xscale("log")
        axis.set_xlabel("data-to-divergence ratio (batch / KL, a run's median over training)")
        axis.set_ylabel(f"{score} {label}")
        axis.set_title(f"{score.capitalize()} performance vs DDR (one point per run)")
        axis.grid(alpha=0.3)
        legend_below(figure, [axis])
        save(figure, out, pdf)
    else:
        plt.close(figure)
    return plotted


def plot_score_vs_batch(lines: dict[str, list[dict]], label: str, out: str, pdf: bool) -> None:
    """Final IQM against the batch multiplier k = batch / the smallest batch of the lines: the N_envs-grown line solid,
    the N_RO-grown one dashed, a family's two lines in one colour (the main study's N_envs against N_RO at equal batch)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4), layout="constrained")
    smallest = min(row["batch_size"] for rows in lines.values() for row in rows)
    families = sorted({name.split(": ")[0] for name in lines})
    for name, rows in lines.items():
        k = [row["batch_size"] / smallest for row in rows]
        y = np.array([row["iqm"] for row in rows])
        error = np.array([[row["iqm"] - row["ci"][0] for row in rows], [row["ci"][1] - row["iqm"] for row in rows]])
        style = dict(color=f"C{families.index(name.split(': ')[0]) % 10}", linestyle="-" if ": N_envs" in name else "--")
        axis.errorbar(k, y, yerr=error, marker="o" if ": N_envs" in name else "s", capsize=3, label=name, **style)
    axis.set_xscale("log", base=2)
    axis.set_xlabel(f"batch multiplier k (batch / {smallest})")
    axis.set_ylabel(f"IQM {label}")
    axis.set_title("Growing the batch by N_envs (solid) or N_RO (dashed), 95 % CI")
    axis.grid(alpha=0.3)
    legend_below(figure, [axis])
    save(figure, out, pdf)


def plot_sps(rows: list[dict], out: str, pdf: bool) -> None:
    """Steps per second against N_envs, a line per series of `score_series` (the follow-up study's Fig. 14)."""
    figure, axis = pyplot().subplots(figsize=(6.4, 4), layout="constrained")
    series = score_series(rows)
    for name in sorted(series, key=lambda name: (min(row["num_steps"] for row in series[name]), name)):
        points = sorted(series[name], key=lambda row: row["num_envs"])
        axis.plot([row["num_envs"] for row in points], [row["sps"] for row in points], marker="o", label=name)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("N_envs (parallel environments)")
    axis.set_ylabel("environment steps per second")
    axis.set_title("Training speed (charts/SPS: a run's median, the median over runs)")
    axis.grid(alpha=0.3)
    legend_below(figure, [axis])
    save(figure, out, pdf)


def plot_ddr_by_budget(points: list[tuple[float, float, int]], label: str, out: str, pdf: bool) -> None:
    """The follow-up study's Fig. 8: a point per run at (its DDR, its score), coloured by its budget (total_timesteps),
    on a log colour scale when the budgets span more than 10x."""
    from matplotlib.colors import LogNorm, Normalize  # noqa: PLC0415

    plt = pyplot()
    ddrs, scores, budgets = (np.array(column, dtype=float) for column in zip(*points, strict=True))
    low, high = budgets.min(), budgets.max()
    norm = LogNorm(low, high) if high > 10 * low else Normalize(low, high if high > low else low + 1)
    figure, axis = plt.subplots(figsize=(6.4, 4), layout="constrained")
    dots = axis.scatter(ddrs, scores, c=budgets, cmap="viridis", norm=norm, s=22)
    figure.colorbar(dots, ax=axis, label="budget (total_timesteps)" + (", log scale" if high > 10 * low else ""))
    axis.set_xscale("log")
    axis.set_xlabel("data-to-divergence ratio (batch / KL, a run's median of metrics/ddr)")
    axis.set_ylabel(label)
    axis.set_title("Score vs DDR by budget (one point per run)")
    axis.grid(alpha=0.3)
    save(figure, out, pdf)


def plot_heatmap(panels: dict[str, np.ndarray], columns: list, rows: list, flags: tuple, label: str, out, pdf) -> None:
    """A panel each (`heatmap_section`): the IQM of each cell written in it, a missing cell blank."""
    plt = pyplot()
    figure, axes = plt.subplots(
        1,
        len(panels),
        figsize=(max(3.6, 1.6 + 0.8 * len(columns)) * len(panels), max(2.8, 1.6 + 0.5 * len(rows))),
        squeeze=False,
        layout="constrained",
    )
    for axis, (title, values) in zip(axes[0], panels.items(), strict=True):
        image = axis.imshow(np.ma.masked_invalid(values), cmap="viridis", origin="lower", aspect="auto")
        for (i, j), value in np.ndenumerate(values):
            if np.isfinite(value):
                axis.text(
                    j,
                    i,
                    f"{value:.3g}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if value < np.nanmean(values) else "black",
                )
        axis.set_xticks(range(len(columns)), [value_text(value) for value in columns])
        axis.set_yticks(range(len(rows)), [value_text(value) for value in rows])
        axis.set_xlabel(flags[0])
        axis.set_ylabel(flags[1])
        axis.set_title(title, fontsize=9)
        figure.colorbar(image, ax=axis, shrink=0.8)
    figure.suptitle(f"IQM {label}\nper {flags[0]} x {flags[1]} (blank: no run)", fontsize=10)
    save(figure, out, pdf)


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def unwritable(path: str, folder: bool) -> str | None:
    """Why --out cannot be written (a folder, or a file's folder), None if it can: made, then probed with a temporary file
    (a file or /proc/x as --out ended the report in a traceback at its first write)."""
    if os.path.exists(path) and os.path.isdir(path) != folder:
        return "a file, not a folder" if folder else "a folder, not a file"
    directory = path if folder else os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as error:
        return f"cannot write there ({error.strerror or error})"
    return None


def make_out_dir(out_dir: str) -> None:
    if why := unwritable(out_dir, folder=True):
        sys.stderr.write(f"error: --out {out_dir}: {why}\n")
        sys.exit(2)


def usage_error(message: str, include_unfinished: bool) -> None:
    """A folder without the runs asked for: one line, exit 2."""
    unfinished = "" if include_unfinished else "; --unfinished counts runs without done.json too"
    sys.stderr.write(f"error: {message}: give the sweep's --runs-dir, the folder of run directories{unfinished}\n")
    sys.exit(2)


def check_modes(runs: list[dict], x: str, best: list[str] | None, heatmap: tuple[str, str] | None) -> None:
    """Refuse, in one line and exit 2, what the runs cannot give: a flag none of them has, an x-axis none can have."""
    check_flags(runs, best or [], "--best")
    check_flags(runs, list(heatmap or ()), "--heatmap")
    if heatmap and flag_name(heatmap[0]) == flag_name(heatmap[1]):
        sys.stderr.write(f"error: --heatmap {heatmap[0]} {heatmap[1]}: give two different flags\n")
        sys.exit(2)
    if x == "time" and not any(len(run["clock"][0]) for run in runs):
        sys.stderr.write("error: --x time: no run has wall times in its event files\n")
        sys.exit(2)
    if x == "updates":
        with (
            contextlib.redirect_stderr(io.StringIO()),
            contextlib.suppress(KeyError, TypeError, ValueError, ZeroDivisionError),
        ):
            if any(update_knots(run["args"]) for run in runs):
                return
        sys.stderr.write("error: --x updates: no run's args.json has its batch_size, update_epochs and minibatches\n")
        sys.exit(2)


def say(intro: str, items: list[str] = ()) -> list[str]:
    """A section's explanation and its list: printed as the report is made, and returned as report.md's lines."""
    for line in (intro, *items):
        print(f"note: {line}")
    return ["", intro, *([""] if items else []), *[f"- {item}" for item in items]]


def batch_section(summary: list[dict], label: str, out_dir: str, pdf: bool) -> tuple[list[str], list[str]]:
    """score_vs_batch.png: the N_envs and N_RO scalings of the same batches side by side (`batch_lines`)."""
    lines = batch_lines(summary)
    if not lines:
        return [], say("score_vs_batch.png not drawn: no two configurations of a family share N_RO or N_envs.")
    plot_score_vs_batch(lines, label, os.path.join(out_dir, "score_vs_batch.png"), pdf)
    smallest = min(row["batch_size"] for rows in lines.values() for row in rows)
    intro = (
        f"score_vs_batch.png: x = batch / {smallest} (the smallest batch of its lines); a line per family of "
        "configurations (names without envs<N>/steps<N>) and way of growing the batch, the base on both:"
    )
    return ["score_vs_batch.png"], say(
        intro, [f"{name}: {', '.join(row['config'] for row in rows)}" for name, rows in lines.items()]
    )


def ddr_budget_section(groups, final_fraction, score, label, out_dir, pdf) -> tuple[list[str], list[str]]:
    """ddr_vs_score_by_budget.png (the follow-up study's Fig. 8), drawn when the runs have more than one budget."""
    points = []
    for by_game in groups.values():
        for run in (run for game_runs in by_game.values() for run in game_runs):
            run_score = final_score(run, final_fraction, score)
            if (ddr := run_ddr(run)) is not None and np.isfinite(run_score):
                points.append((ddr, run_score, run["args"].get("total_timesteps", run["total_steps"])))
    budgets = sorted({budget for _, _, budget in points})
    if len(budgets) < 2:
        why = "no run has both a metrics/ddr and a score" if not budgets else f"one budget ({budgets[0]:,} steps)"
        return [], say(f"ddr_vs_score_by_budget.png not drawn: {why}.")
    plot_ddr_by_budget(points, f"{score} {label}", os.path.join(out_dir, "ddr_vs_score_by_budget.png"), pdf)
    scale = "log" if budgets[-1] > 10 * budgets[0] else "linear"
    return ["ddr_vs_score_by_budget.png"], say(
        f"ddr_vs_score_by_budget.png: a point per run, x = the median of its metrics/ddr over training, y = its {score} "
        f"{label}, colour = its total_timesteps ({len(budgets)} budgets, {budgets[0]:,} to {budgets[-1]:,}: {scale} scale)."
    )


def sps_section(groups: dict, out_dir: str, pdf: bool) -> tuple[list[str], list[str]]:
    """sps_vs_num_envs.png and its table: each configuration's median steps per second (`run_sps`) against N_envs."""
    rows = []
    for config, by_game in groups.items():
        flags = next(run for game_runs in by_game.values() for run in game_runs)["args"]
        rates = [sps for game_runs in by_game.values() for run in game_runs if (sps := run_sps(run)) is not None]
        if rates:
            shape = {name: flags.get(name) for name in ("num_envs", "num_steps", "batch_size", "schedule")}
            rows.append({"config": config, **shape, "sps": float(np.median(rates)), "runs": len(rates)})
    if not rows:
        return [], say("sps_vs_num_envs.png not drawn: no run logged charts/SPS.")
    if drawn := [row for row in rows if not row["schedule"]]:
        plot_sps(drawn, os.path.join(out_dir, "sps_vs_num_envs.png"), pdf)
    text = say(
        "sps_vs_num_envs.png: steps per second (charts/SPS, which counts training and the metrics, not the environments' "
        "creation), a run's median after its first fifth of points, a configuration's median over its runs"
        + ("; schedules are in the table only" if len(drawn) < len(rows) else "")
        + ":"
    )
    text += ["", "| configuration | N_envs | runs | steps per second |", "|---|---|---|---|"]
    text += [f"| {row['config']} | {row['num_envs']} | {row['runs']} | {row['sps']:,.0f} |" for row in rows]
    return ["sps_vs_num_envs.png"] if drawn else [], text


def heatmap_section(groups, games, flags, final_fraction, score, label, out_dir, pdf) -> tuple[list[str], list[str]]:
    """heatmap_FLAGX_FLAGY.png and its tables: the IQM score of each cell of two swept flags, a panel per setting
    (`heatmap_cells`) and per game, or one over all games (IQM over runs x games, as rliable's) when their scores are
    normalised."""
    flags = tuple(flag_name(flag) for flag in flags)
    columns, rows, cells, notes = heatmap_cells(groups, flags)
    pooled = len(games) > 1 and label not in ("return", "score")  # one normalised scale: the games pool
    panels = {}
    for setting in sorted({setting for setting, _, _ in cells}, key=numbers_as_numbers):
        for title, panel_games in [("all games", games)] if pooled else [(game, [game]) for game in games]:
            values = np.full((len(rows), len(columns)), np.nan)
            for (cell_setting, x, y), configs in cells.items():
                runs = [run for config in configs for game in panel_games for run in groups[config].get(game, [])]
                scores = np.array([final_score(run, final_fraction, score) for run in runs if cell_setting == setting])
                if np.isfinite(scores).any():
                    values[rows.index(y), columns.index(x)] = iqm(scores[np.isfinite(scores)][:, None])
            panels[f"{title}, {setting}" if setting else title] = values
    name = f"heatmap_{flags[0]}_{flags[1]}.png"
    plot_heatmap(panels, columns, rows, flags, f"{score} {label}", os.path.join(out_dir, name), pdf)
    over = "over runs x games" if pooled else "per game"
    intro = (
        f"{name}: the IQM {score} {label} of each {flags[0]} x {flags[1]} cell, {over} (every configuration, before --best):"
    )
    text = say(intro, notes)
    for title, values in panels.items():
        text += ["", f"{title}: IQM {score} {label}, rows {flags[1]}, columns {flags[0]}", ""]
        text += [f"| {flags[1]} \\ {flags[0]} | " + " | ".join(value_text(x) for x in columns) + " |"]
        text += ["|---|" + "---|" * len(columns)]
        for i, y in enumerate(rows):
            cells_text = ["" if np.isnan(value) else f"{value:.3f}" for value in values[i]]
            text.append(f"| {value_text(y)} | " + " | ".join(cells_text) + " |")
    return [name], text


NOTHING_TO_AGGREGATE = "nothing left to aggregate: every configuration was left out (the data notes say why)"


def report(
    sweep_dir: str,
    out_dir: str,
    final_fraction: float,
    points: int,
    reps: int,
    pdf: bool,
    include_unfinished: bool,
    baseline: str | None = None,
    x: str = "steps",
    score: str = "final",
    best: list[str] | None = None,
    heatmap: tuple[str, str] | None = None,
) -> None:
    runs = load_runs(sweep_dir, include_unfinished)
    if not runs:
        usage_error(f"no {'' if include_unfinished else 'finished '}run under {sweep_dir}", include_unfinished)
    best = [best] if isinstance(best, str) else best
    check_modes(runs, x, best, heatmap)
    groups = group_runs(runs)
    configs = sorted(groups, key=numbers_as_numbers)
    groups = all_groups = {config: groups[config] for config in configs}
    choices = [f"x-axis of the curves: {X_METHODS[x]}."]  # what this report chose: printed, and listed in report.md
    if best is not None:
        groups, picked = best_per_value(groups, [flag_name(flag) for flag in best], final_fraction, score)
        per = " x ".join(best)
        choices += [f"--best {per}: per game and value, the configuration with the highest IQM {score} score over seeds:"]
        choices += picked
        configs = sorted(groups, key=numbers_as_numbers)
        groups = {config: groups[config] for config in configs}
    if baseline is not None and baseline not in groups:
        sys.stderr.write(f"error: --baseline {baseline!r}: no such configuration; the sweep's: {', '.join(configs)}\n")
        sys.exit(2)
    make_out_dir(out_dir)
    for choice in choices:  # once the report is sure to be made
        print(f"note: {choice}")
    games = sorted({run["env_id"] for run in runs})
    label, kinds = score_label(runs), {run["env_id"]: score_kind(run) for run in runs}
    matrices, kept = score_matrices(groups, games, final_fraction, score)
    if matrices and label == "score":  # raw returns or solve rates pooled with normalised ones: the aggregates mix scales
        for game in (game for game in games if kinds[game] == "return"):
            data_note(game, "no normalising constants in metrics.py: its raw returns are pooled with normalised scores")
        for game in (game for game in games if kinds[game] == "solve rate"):
            data_note(game, "a Kinetix solve rate (the fraction of its tasks solved) is pooled with other games' scores")
    colors = config_colors(configs)
    moved, xlabel = on_x_axis([run for by_game in groups.values() for game_runs in by_game.values() for run in game_runs], x)
    groups_x = {
        config: {game: [moved[id(run)] for run in game_runs] for game, game_runs in by_game.items()}
        for config, by_game in groups.items()
    }
    grid = np.linspace(0, max((run["x_end"] for run in moved.values()), default=1), points + 1)[1:]
    normalised = label not in ("return", "score")  # one kind of normalised score: the optimality gap has a meaning
    names = AGGREGATE_NAMES[: 4 if normalised else 3]
    estimates, intervals = interval_estimates(matrices, lambda scores: aggregate_metrics(scores, normalised), reps)
    summary = []
    for config, matrix in matrices.items():
        flags = groups[config][games[0]][0]["args"]
        ddrs = [ddr for game_runs in groups[config].values() for run in game_runs if (ddr := run_ddr(run)) is not None]
        summary.append(
            {
                "config": config,
                "num_envs": flags["num_envs"],
                "num_steps": flags["num_steps"],
                "schedule": flags.get("schedule"),
                "batch_size": flags["batch_size"],
                "update_epochs": flags["update_epochs"],
                "runs": matrix.shape[0],
                "iqm": float(estimates[config][1]),
                "ci": (float(intervals[config][0][1]), float(intervals[config][1][1])),
                "aggregates": estimates[config],
                "aggregate_cis": intervals[config].T,  # (metric, low/high)
                "mean": float(estimates[config][2]),  # rliable's mean over games of the per-game means
                "ddr": float(np.median(ddrs)) if ddrs else float("nan"),
                "per_game": matrix.mean(axis=0),
            }
        )

    plot_game_curves(groups_x, games, grid, colors, label, os.path.join(out_dir, "learning_curves.png"), pdf, xlabel)
    curve_matrices = {
        config: np.array([[score_curve(moved[id(kept[config][game][i])], grid) for game in games] for i in range(len(matrix))])
        for config, matrix in matrices.items()
    }
    if curve_matrices:
        iqm_reps, iqm_out = max(reps // 10, 100), os.path.join(out_dir, "iqm_curves.png")
        plot_iqm_curves(curve_matrices, grid, colors, label, iqm_reps, iqm_out, pdf, xlabel)
    tags = plot_metric_curves(groups_x, grid, colors, os.path.join(out_dir, "metric_curves.png"), pdf, xlabel=xlabel)
    # each game's dynamics beside its score, as the paper's Fig. 3 and 10 (with several games the figure above pools them)
    figure_names = {game: "metric_curves_" + re.sub(r"[^\w.-]", "_", game) + ".png" for game in games}
    game_figures = figure_names if tags and len(games) > 1 else {}
    for game, name in game_figures.items():
        plot_metric_curves(groups_x, grid, colors, os.path.join(out_dir, name), pdf, game, label, xlabel)
    scored = f"{score} {label}"  # the figures and tables of each run's one score
    if summary:
        plot_score_vs_envs(summary, scored, os.path.join(out_dir, "score_vs_num_envs.png"), pdf)
        plot_aggregate_metrics(summary, names, colors, scored, os.path.join(out_dir, "aggregate_metrics.png"), pdf)
    has_profiles = bool(summary) and (normalised or len(games) == 1)  # raw returns of several games share no scale
    if has_profiles:
        plot_performance_profiles(matrices, colors, scored, reps, os.path.join(out_dir, "performance_profiles.png"), pdf)
    has_ddr = plot_ddr(groups, final_fraction, colors, label, os.path.join(out_dir, "ddr_vs_score.png"), pdf, score)
    sections = [  # (figures, report lines) of the report's other figures, each drawn where the sweep has its data
        batch_section(summary, scored, out_dir, pdf),
        ddr_budget_section(groups, final_fraction, score, label, out_dir, pdf),
        sps_section(groups, out_dir, pdf),
    ]
    if heatmap is not None:  # of every configuration (before --best: its cells are the grid searched)
        sections.append(heatmap_section(all_groups, games, heatmap, final_fraction, score, label, out_dir, pdf))
    improvement = {}  # {configuration: (P(X > baseline), (low, high) or None for a single run)}
    if baseline is not None and baseline not in matrices:
        data_note(baseline, "--baseline is left out of the aggregate (above): no probability of improvement")
    elif baseline is not None and len(matrices) > 1:
        pairs = {config: (matrix, matrices[baseline]) for config, matrix in matrices.items() if config != baseline}
        estimates, intervals = interval_estimates(pairs, probability_of_improvement, reps)
        single = {config for config, (x, y) in pairs.items() if min(len(x), len(y)) == 1}  # a CI of 1 run is no CI
        improvement = {c: (float(estimates[c]), None if c in single else np.ravel(intervals[c]).tolist()) for c in pairs}
        plot_improvement(improvement, baseline, colors, os.path.join(out_dir, "probability_of_improvement.png"), pdf)

    over = "the episodes ending" + (" (Kinetix: the solve-rate evaluations)" if "solve rate" in kinds.values() else "")
    over = "the solve-rate evaluations (charts/solve_rate)" if label == "solve rate" else over
    scoring = f"{score.capitalize()} {label} = mean over {over} in the last {final_fraction:.0%} of each run's steps"
    if score == "max":
        scoring = (
            f"Max {label} = the highest mean over {over} in a window of {final_fraction:.0%} of each run's steps, over "
            "the windows that end at one of them inside training and the last window (--score max)"
        )
    choices.insert(1, f"score (--score {score}): {scoring}.")
    lines = [
        f"# {os.path.basename(os.path.abspath(sweep_dir))}",
        "",
        f"{len(runs)} runs, {len(games)} game(s): {', '.join(games)}. {scoring}; IQM over runs x games with a 95 % "
        f"stratified bootstrap CI ({reps} resamples, rliable; {max(reps // 10, 100)} per point of the IQM curves).",
        "",
        f"| configuration | N_envs | N_RO | batch | epochs | runs per game | IQM {scored} [95 % CI] | mean | DDR median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        sizes = f"{row['num_envs']} | {row['num_steps']}" if not row["schedule"] else f"schedule {row['schedule']} | "
        ci = f"[{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]"
        lines.append(
            f"| {row['config']} | {sizes} | {row['batch_size']} | "
            f"{row['update_epochs']} | {row['runs']} | {row['iqm']:.3f} {ci if row['runs'] > 1 else '(1 run: no CI)'} "
            f"| {row['mean']:.3f} | {row['ddr']:.4g} |"
        )
    lines += [
        "",
        f"rliable's aggregates of the {scored}, each with a 95 % stratified bootstrap CI (median and mean over games of"
        " each game's mean over seeds, IQM over runs x games"
        + (", optimality gap: the mean shortfall below 1, lower is better" if normalised else "")
        + "):",
        "",
        "| configuration | " + " | ".join(f"{name} [95 % CI]" for name in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for row in summary:
        cells = [
            f"{value:.3f} " + (f"[{low:.3f}, {high:.3f}]" if row["runs"] > 1 else "(1 run: no CI)")
            for value, (low, high) in zip(row["aggregates"], row["aggregate_cis"], strict=True)
        ]
        lines.append(f"| {row['config']} | " + " | ".join(cells) + " |")
    if improvement:
        lines += [
            "",
            f"Probability of improvement over {baseline}, P(X > {baseline}) [95 % CI]: per game, the probability that a run "
            f"of X scores above a run of {baseline} (a tie counts half), averaged over games; X is better when the whole CI "
            "lies above 0.5 (Agarwal et al. 2021).",
            "",
            f"| configuration | P(X > {baseline}) [95 % CI] |",
            "|---|---|",
            *[
                f"| {config} | {p:.3f} {f'[{ci[0]:.3f}, {ci[1]:.3f}]' if ci else '(1 run: no CI)'} |"
                for config, (p, ci) in improvement.items()
            ],
        ]
    lines += [
        "",
        f"Mean {scored} per game (over seeds):",
        "",
        "| configuration | " + " | ".join(games) + " |",
        "|---|" + "---|" * len(games),
    ]
    for row in summary:
        lines.append(f"| {row['config']} | " + " | ".join(f"{value:.3f}" for value in row["per_game"]) + " |")
    if not summary:  # every configuration left out (each noted): no table, no pooling of scores to warn about
        lines = [lines[0], "", f"{len(runs)} runs, {len(games)} game(s): {', '.join(games)}. {NOTHING_TO_AGGREGATE}."]
    figures = ["learning_curves.png"] + ["iqm_curves.png", "aggregate_metrics.png", "score_vs_num_envs.png"] * bool(summary)
    figures += ["performance_profiles.png"] if has_profiles else []
    figures += ["probability_of_improvement.png"] if improvement else []
    figures += ["metric_curves.png", *game_figures.values()] if tags else []
    figures += ["ddr_vs_score.png"] if has_ddr else []
    for section_figures, section_lines in sections:
        figures += section_figures
        lines += section_lines
    lines += ["", *[f"![{name}]({name})" for name in figures], ""]
    lines += ["## How this report was made", "", *[f"- {choice}" for choice in choices], ""]
    if DATA_NOTES:
        lines += ["## Data left out or substituted", "", *[f"- {note}" for note in DATA_NOTES], ""]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines[: 6 + len(summary)]))
    print(f"wrote {os.path.join(out_dir, 'report.md')}")
    if not summary:
        sys.stderr.write(f"error: {NOTHING_TO_AGGREGATE}; {os.path.join(out_dir, 'report.md')} has the curves only\n")
        sys.exit(1)


# --------------------------------------------------------------------------------------
# coverage
# --------------------------------------------------------------------------------------


def joint_coverage(points_by_run: dict[str, np.ndarray], grid: int) -> dict[str, float]:
    """Cvg of each run's 2-D points after rescaling all runs' points together to [0, 1]^2,
    so that every run is measured on the same grid."""
    names = list(points_by_run)
    unit = metrics.rescale_to_unit_square(np.concatenate([points_by_run[name] for name in names]))
    coverage, start = {}, 0
    for name in names:
        count = len(points_by_run[name])
        coverage[name] = metrics.grid_coverage(unit[start : start + count], grid)
        start += count
    return coverage


def umap_projection(features: np.ndarray, seed: int) -> np.ndarray:
    import umap  # noqa: PLC0415 - slow import (numba)

    reducer = umap.UMAP(n_components=2, n_neighbors=min(15, len(features) - 1), random_state=seed, n_jobs=1)  # seeded: 1
    return reducer.fit_transform(features.astype(np.float32))


def coverage(sweep_dir: str, out_dir: str, grid: int, points_per_run: int, pdf: bool, include_unfinished: bool) -> None:
    runs = [
        run for run in load_runs(sweep_dir, include_unfinished) if os.path.exists(os.path.join(run["dir"], "embeddings.npz"))
    ]
    if not runs:
        usage_error(f"no run with embeddings.npz under {sweep_dir} (train with --save-embeddings)", include_unfinished)
    make_out_dir(out_dir)
    rng = np.random.default_rng(0)
    rows = []
    for game in sorted({run["env_id"] for run in runs}):
        game_runs = sorted(
            (run for run in runs if run["env_id"] == game), key=lambda r: (numbers_as_numbers(r["config"]), r["seed"])
        )
        embeddings = [np.load(os.path.join(run["dir"], "embeddings.npz")) for run in game_runs]
        # Equal sample sizes: coverage grows with the number of points.
        count = min(points_per_run, *(len(e["features"]) for e in embeddings))
        picks = [rng.choice(len(e["features"]), count, replace=False) for e in embeddings]
        features = np.concatenate([e["features"][pick] for e, pick in zip(embeddings, picks, strict=True)])
        values = np.concatenate([e["values"][pick] for e, pick in zip(embeddings, picks, strict=True)])
        projected = umap_projection(features, seed=0)
        names = [os.path.basename(run["dir"]) for run in game_runs]
        by_run = {name: projected[i * count : (i + 1) * count] for i, name in enumerate(names)}
        cvg = joint_coverage(by_run, grid)
        unit = metrics.rescale_to_unit_square(projected)
        figure, axes = panel_grid(len(game_runs))
        for i, (axis, run) in enumerate(zip(axes.flat, game_runs, strict=False)):
            part = slice(i * count, (i + 1) * count)
            colors = dict(c=values[part], vmin=values.min(), vmax=values.max(), cmap="viridis")  # one scale: the colorbar's
            scatter = axis.scatter(unit[part, 0], unit[part, 1], s=3, **colors)
            axis.set_title(f"{run['config']} seed {run['seed']}\nCvg = {cvg[names[i]]:.3f}", fontsize=8)
            axis.set_xlim(0, 1), axis.set_ylim(0, 1), axis.set_xticks([]), axis.set_yticks([]), axis.set_aspect("equal")
            rows.append((game, run["config"], run["seed"], count, cvg[names[i]]))
        figure.colorbar(scatter, ax=axes.ravel().tolist()[: len(game_runs)], label="critic value", shrink=0.8)
        figure.suptitle(f"{game}: UMAP of penultimate features ({count} states per run, {grid}x{grid} grid)")
        save(figure, os.path.join(out_dir, f"coverage_{game}.png"), pdf)
    lines = [
        "# State-space coverage",
        "",
        f"Cvg = occupied cells of a {grid} x {grid} grid / {grid * grid}, UMAP fitted per game on all its runs.",
        "",
        "| game | configuration | seed | states | Cvg |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {game} | {config} | {seed} | {count} | {value:.4f} |" for game, config, seed, count, value in rows]
    with open(os.path.join(out_dir, "coverage.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


# --------------------------------------------------------------------------------------
# curves (a few runs, one line each)
# --------------------------------------------------------------------------------------


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` points (shorter at the start), same length as the input."""
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (cumulative[1:] - cumulative[np.arange(1, len(values) + 1) - counts]) / counts


METRIC_ROW = (  # the main study's Fig. 3 (return, feature rank, dormant, weight norm, kurtosis) and the policy change
    "metrics/feature_rank",
    "metrics/dormant_pct",
    "metrics/weight_norm",
    "metrics/grad_kurtosis",
    "metrics/kl_behavior",
    "metrics/ddr",
)


def load_run_dirs(run_dirs: list[str]) -> list[dict]:
    """The runs of `curves`: each directory's scalars, clock and args.json (empty when it has none)."""
    runs = []
    for run_dir in run_dirs:
        scalars, clock = read_events(run_dir)
        try:
            with open(os.path.join(run_dir, "args.json")) as f:
                args = json.load(f)
        except (OSError, ValueError):
            args = {}
        run = {"dir": run_dir, "args": args if isinstance(args, dict) else {}, "scalars": scalars, "clock": clock}
        runs.append(run | {"total_steps": last_step(run)})
    return runs


def run_name(run: dict) -> str:
    return os.path.basename(run["dir"].rstrip("/"))


def draw_run_lines(axis, runs: list[dict], moved: dict, tag: str, window: int) -> int:
    """A line per run with finite points of `tag` (on the x-axis of `moved`), a moving average of `window` points;
    returns the lines drawn. A run without the tag is noted (a run without an x was, by `x_map`)."""
    plotted = 0
    for run in runs:
        steps, values = moved[id(run)]["scalars"].get(tag, ((), ()))
        if len(steps) == 0:
            if tag not in run["scalars"] or len(run["scalars"][tag][0]) == 0:
                done = os.path.exists(os.path.join(run["dir"], "done.json"))
                data_note(run["dir"], f"no {tag!r} scalars{'' if done else ' yet'}: left out of the plot")
            continue
        plotted += 1
        style = dict(marker=".", markersize=4) if window == 1 and len(values) < 50 else {}
        axis.plot(steps, moving_average(values, window), label=run_name(run), **style)
        print(f"{run_name(run)}: {tag}: {len(values)} points, last {window}: mean {values[-window:].mean():.4g}")
    axis.grid(alpha=0.3)
    if tag == "metrics/ddr" and plotted:  # batch / KL spans orders of magnitude
        axis.set_yscale("log")
    return plotted


def save_curves(figure, out: str, pdf: bool, plotted: int) -> None:
    if plotted:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        save(figure, out, pdf)  # and closes it
    else:
        pyplot().close(figure)


def plot_curves(runs: list[dict], tag: str, out: str, window: int, pdf: bool, x: str = "steps") -> tuple[set[str], int]:
    """One line per run that has finite points of `tag`; nothing is written when none has. Returns the scalar tags of
    the runs and the number of lines drawn."""
    moved, xlabel = on_x_axis(runs, x)
    figure, axis = pyplot().subplots(figsize=(6, 4), layout="constrained")
    plotted = draw_run_lines(axis, runs, moved, tag, window)
    axis.set_xlabel(xlabel)
    name = tag.rsplit("/", maxsplit=1)[-1].replace("_", " ")
    axis.set_ylabel(name + (f" (moving average of {window})" if window > 1 else ""))
    axis.set_title(tag)
    if len(runs) <= 8 and plotted:
        axis.legend(fontsize=6)
    save_curves(figure, out, pdf, plotted)
    return {name for run in runs for name in run["scalars"]}, plotted


def plot_metric_row(runs: list[dict], out: str, window: int, pdf: bool, x: str = "steps") -> tuple[set[str], int]:
    """One row of panels, as the main study's Fig. 3 draws one run: the episodic return (a moving average of `window`
    episodes) beside the study's metrics (METRIC_ROW, as logged every --metrics-interval iterations). A metric that no
    run logged has no panel (a printed note). Returns the runs' tags and the panels drawn."""
    tags = {tag for run in runs for tag, (steps, _) in run["scalars"].items() if len(steps)}
    panels = [RETURN_TAG] + [tag for tag in METRIC_ROW if tag in tags]
    for tag in METRIC_ROW:
        if tag not in tags:
            print(f"note: no run logged {tag}: its panel is left out")
    moved, xlabel = on_x_axis(runs, x)
    figure, axes = pyplot().subplots(1, len(panels), figsize=(2.9 * len(panels), 3.0), squeeze=False, layout="constrained")
    drawn = 0
    for axis, tag in zip(axes[0], panels, strict=True):
        lines = draw_run_lines(axis, runs, moved, tag, window if tag == RETURN_TAG else 1)
        drawn += lines > 0
        title = "episodic return" + (f" (moving average of {window})" if window > 1 else "")
        axis.set_title(title if tag == RETURN_TAG else METRIC_TITLES.get(tag, tag), fontsize=9)
        axis.set_xlabel(xlabel, fontsize=8)
        axis.tick_params(labelsize=7)
    names = ", ".join(run_name(run) for run in runs) if len(runs) <= 2 else f"{len(runs)} runs"
    figure.suptitle(f"Learning dynamics: {names}", fontsize=10)
    if len(runs) > 1 and drawn:
        legend_below(figure, axes[0])
    save_curves(figure, out, pdf, drawn)
    return tags, drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    report_parser = commands.add_parser("report", help="figures and table of a sweep directory")
    report_parser.add_argument("sweep_dir", help="the sweep's --runs-dir (e.g. runs/fixed_budget)")
    report_parser.add_argument("--out", help="output folder (default: SWEEP_DIR/report)")
    report_parser.add_argument(
        "--final-fraction",
        type=float,
        default=0.1,
        help="final score = mean over episodes ending in this last fraction of training",
    )
    report_parser.add_argument("--points", type=int, default=20, help="points of the curves over training")
    report_parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples for the CIs")
    report_parser.add_argument(
        "--baseline", metavar="CONFIG", help="also each other configuration's probability of improvement over CONFIG"
    )
    report_parser.add_argument(
        "--score",
        default="final",
        metavar="{final,max}",
        help="a run's score: final (the mean over the episodes in the last --final-fraction of training) or max (the "
        "highest such windowed mean over training)",
    )
    report_parser.add_argument(
        "--best",
        nargs="+",
        metavar="FLAG",
        help="per game and value of this args.json flag (e.g. learning_rate; several: per combination), only the "
        "configuration with the highest IQM score over seeds",
    )
    report_parser.add_argument(
        "--heatmap", nargs=2, metavar=("FLAG_X", "FLAG_Y"), help="also the IQM score per cell of two swept flags"
    )
    coverage_parser = commands.add_parser("coverage", help="UMAP state-space coverage of runs with embeddings")
    coverage_parser.add_argument("sweep_dir", help="folder of run directories made with --save-embeddings")
    coverage_parser.add_argument("--out", help="output folder (default: SWEEP_DIR/report)")
    coverage_parser.add_argument("--grid", type=int, default=50, help="G: the G x G grid of the coverage")
    coverage_parser.add_argument("--points-per-run", type=int, default=2000, help="states sampled from each run")
    for sub in (report_parser, coverage_parser):
        sub.add_argument("--pdf", action="store_true", help="also write PDFs next to the PNGs")
        sub.add_argument("--unfinished", action="store_true", help="include runs without done.json")
    curves = commands.add_parser("curves", help="learning curves of run directories")
    for sub in (report_parser, curves):
        sub.add_argument("--strict", action="store_true", help="exit 1 when a datum was left out or substituted")
    curves.add_argument("run_dirs", nargs="+", help="run directories (runs/{env_id}__{exp_name}__{seed}__{time})")
    curves.add_argument("--tag", help=f"scalar tag to plot (default: {RETURN_TAG})")
    curves.add_argument(
        "--metrics",
        action="store_true",
        help="one row of panels: the episodic return beside the study's metrics (feature rank, dormant neurons, weight "
        "norm, gradient kurtosis, KL, DDR), as the main study's Fig. 3",
    )
    for sub in (report_parser, curves):
        sub.add_argument(
            "--x",
            default="steps",
            metavar="{steps,updates,time}",
            help="the curves' x-axis: steps (environment steps), updates or time",
        )
    curves.add_argument("--out", default="learning_curve.png", help="output PNG path")
    curves.add_argument("--smooth", type=int, default=10, help="moving-average window in logged points")
    curves.add_argument("--pdf", action="store_true", help="also write a PDF next to the PNG")
    args = parser.parse_args()

    def bound(flag: str, value: int, low: int, high: int | None) -> None:  # 1e20 ended in numpy's traceback
        if not low <= value <= (high or value):
            parser.exit(2, f"error: --{flag} {value}: must be at least {low}" + (f", at most {high}\n" if high else "\n"))

    if getattr(args, "x", "steps") not in X_LABELS:
        parser.exit(2, f"error: --x {args.x}: give steps, updates or time\n")
    if getattr(args, "score", "final") not in ("final", "max"):
        parser.exit(2, f"error: --score {args.score}: give final or max\n")
    if args.command == "curves":
        run_files = ("args.json", "events.out.tfevents.*")  # a folder of runs has neither
        missing = [d for d in args.run_dirs if not any(glob.glob(os.path.join(d, name)) for name in run_files)]
        if missing:
            parser.exit(2, f"error: not a run directory (no args.json, no event file): {missing[0]}\n")
        bound("smooth", args.smooth, 1, 10**6)
        if not os.path.splitext(args.out)[1]:
            args.out += ".png"  # what savefig writes: the file printed and probed is that one
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415

        if os.path.splitext(args.out)[1][1:].lower() not in FigureCanvasAgg.get_supported_filetypes():
            parser.exit(2, f"error: --out {args.out}: not a format matplotlib writes (give .png, .pdf or .svg)\n")
        if why := unwritable(args.out, folder=False):
            parser.exit(2, f"error: --out {args.out}: {why}\n")
        if args.metrics and args.tag is not None:
            parser.exit(2, "error: --metrics draws the return and the metrics' tags: leave out --tag\n")
        runs = load_run_dirs(args.run_dirs)
        check_modes(runs, args.x, None, None)
        if args.metrics:
            tags, plotted = plot_metric_row(runs, args.out, args.smooth, args.pdf, args.x)
            what = f"{RETURN_TAG} or the study's metrics"
        else:
            tags, plotted = plot_curves(runs, args.tag or RETURN_TAG, args.out, args.smooth, args.pdf, args.x)
            what = repr(args.tag or RETURN_TAG)
        if not plotted:  # (an all-NaN tag has no point left)
            known = f"the runs' tags: {', '.join(sorted(tags))}" if tags else "the runs have logged no scalar yet"
            parser.exit(2 if tags else 1, f"error: no run has finite points of {what}, nothing written ({known})\n")
    elif not os.path.isdir(args.sweep_dir):
        parser.exit(2, f"error: {args.sweep_dir!r} is not a directory\n")
    elif args.command == "report":
        if not 0 < args.final_fraction <= 1:
            parser.exit(2, f"error: --final-fraction {args.final_fraction}: must be > 0 and at most 1\n")
        bound("points", args.points, 2, 10**5)
        bound("reps", args.reps, 10, 10**6)
        out_dir = args.out or os.path.join(args.sweep_dir, "report")
        modes = dict(x=args.x, score=args.score, best=args.best, heatmap=args.heatmap)
        report(
            args.sweep_dir,
            out_dir,
            args.final_fraction,
            args.points,
            args.reps,
            args.pdf,
            args.unfinished,
            args.baseline,
            **modes,
        )
    else:
        bound("grid", args.grid, 1, 10**5)  # grid**2 cells, counted in int64
        bound("points-per-run", args.points_per_run, 3, None)
        out_dir = args.out or os.path.join(args.sweep_dir, "report")
        coverage(args.sweep_dir, out_dir, args.grid, args.points_per_run, args.pdf, args.unfinished)
    if getattr(args, "strict", False) and DATA_NOTES:
        parser.exit(1, f"error: --strict: {len(DATA_NOTES)} datum(s) left out or substituted (the warnings above)\n")


if __name__ == "__main__":
    main()
