#!/usr/bin/env bash
# The launcher every sweep uses: reads commands, one per line, from a file or stdin.
#
#   bash sweeps/launch.sh commands.txt
#   some_sweep_loop | LAUNCHER=print bash sweeps/launch.sh
#
# A Slurm array instead of one job a command (one line a task, each its own LOG_DIR; from the repository root):
#   LAUNCHER=print bash sweeps/fixed_budget.sh > commands.txt
#   sbatch --array=1-$(wc -l < commands.txt) --wrap='sed -n "${SLURM_ARRAY_TASK_ID}p" commands.txt |
#       LOG_DIR=sweep_logs/array-$SLURM_ARRAY_TASK_ID bash sweeps/launch.sh'
# Two launchers may share a RUNS_DIR (a run in training is skipped: the scripts lock it), but two that reach the same
# new run within the seconds before its script has created its run directory would both train it.
#
# Environment:
#   LAUNCHER      local (default): run with JOBS parallel workers on this machine
#                 print: only print the commands (a dry run; nothing is checked or started)
#                 slurm: submit each command as one job with `sbatch --wrap`; the job looks at its run when it
#                 starts, and again when Slurm requeues it (pre-emption, --requeue): it resumes from the checkpoint
#                 exec: check the one command of the file as below and run it in this process (what a Slurm job does)
#   JOBS          local parallel workers (default: one per NPROC GPUs seen, else 1; more runs than GPUs can
#                 share them, e.g. JOBS=16 on 8 GPUs); they share the cores: unless OMP_NUM_THREADS is set, it
#                 is cores / (workers x NPROC), workers = JOBS or the commands if fewer, which torch follows (a
#                 script training on a GPU takes 1 thread), as runs that each take every core slow each other
#                 down; with several GPUs (CUDA_VISIBLE_DEVICES's, else nvidia-smi's), each worker gets NPROC of
#                 its own (in turn, when the workers need more than there are)
#   SBATCH_ARGS   extra sbatch arguments for LAUNCHER=slurm, e.g. "--gres=gpu:1 --time=24:00:00"
#   LOG_DIR       where each command's output goes (default sweep_logs/<date-time>-<pid>)
#   NPROC         run each command ("PYTHON SCRIPT FLAGS") as NPROC processes of one run with torchrun
#                 (default 1: as is). Locally: `PYTHON -m torch.distributed.run --standalone
#                 --nproc-per-node NPROC SCRIPT FLAGS`. With LAUNCHER=slurm: one srun task per node of
#                 the job, each starting NPROC processes that meet at the first node; ask for the nodes
#                 and GPUs in SBATCH_ARGS, e.g. NPROC=4 SBATCH_ARGS="--nodes=2 --gres=gpu:4".
#
# A command that names its run (--env-id, and optionally --exp-name (default: the script's name), --seed and
# --runs-dir, as every sweep script does; ppo_kinetix.py's --task-set and --env-size, both given, name its env_id
# Kinetix-<set>-<size>) is matched to runs/<env_id>__<exp_name>__<seed>__<time>/:
#   - a run directory with done.json (the scripts' completion marker) -> skipped;
#   - one whose lock file a process holds (the scripts hold it while they train) -> skipped as running;
#   - one with checkpoint.pt (interrupted, pre-empted, crashed) -> resumed with --resume (a run started --init-from a
#     checkpoint: without --init-from and --init-optimizer, which the scripts do not take with --resume);
#   - otherwise the command starts a new run.
# The run must have been trained with the command's flags (its args.json; a flag the command leaves out means the
# script's default): a run of another budget or other flags under that name is neither skipped nor resumed but
# listed as a failure.
# With LAUNCHER=slurm a command whose job is still queued or running (in squeue, by its job name: sweep-<checksum
# of the command>) is skipped too, so that a sweep re-run while its jobs wait submits none twice.
# Failed commands are listed at the end with their log files; the exit status is 1 then. Ctrl-C (or SIGTERM to the
# launcher) starts nothing more: the runs in flight get the signal, save a checkpoint and stop, and the launcher exits
# with the signal's status once they have; a re-run resumes them. Paths in commands cannot hold spaces (flags are read
# at whitespace). The flag comparison runs `python3` (3.8 or newer).
set -uo pipefail

LAUNCHER=${LAUNCHER:-local}
JOBS=${JOBS:-}
SBATCH_ARGS=${SBATCH_ARGS:-}
LOG_DIR=${LOG_DIR:-sweep_logs/$(date +%Y%m%d-%H%M%S)-$$}
NPROC=${NPROC:-1}

case $LAUNCHER in local | print | slurm | exec) ;; *)
    echo "error: LAUNCHER must be local, print, slurm or exec, got '$LAUNCHER'" >&2
    exit 2
    ;;
esac
if [[ -n $JOBS ]] && ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
    echo "error: JOBS must be a positive integer, got '$JOBS'" >&2
    exit 2
fi
if ! [[ $NPROC =~ ^[1-9][0-9]*$ ]]; then
    echo "error: NPROC must be a positive integer, got '$NPROC'" >&2
    exit 2
fi
if (($# > 1)) || { (($# == 1)) && [[ ! -f $1 || ! -r $1 ]]; }; then
    echo "error: usage: bash sweeps/launch.sh [COMMANDS_FILE] (or commands on stdin); '${1:-}' is not a readable file" >&2
    exit 2
fi

# The value of a flag in a command ("--seed 3" or "--seed=3"), empty when absent.
flag_value() {
    local pattern="(^|[[:space:]])$1[[:space:]=]+([^[:space:]]+)"
    [[ $2 =~ $pattern ]] && echo "${BASH_REMATCH[2]}"
}

# The flags whose values differ between a run's args.json and a command, as "--name there / here; ...";
# nothing when all match; the script too (args.json's "script"). A flag the command does not give stands for the
# script's default (read from its Args class; one computed from more than numbers must be given). Not compared:
# --resume, --runs-dir, --torch-threads, --jax-cache-dir (ppo_kinetix.py's compilation cache, its default computed
# from the environment), a value "auto" (the script chooses), the values a script derives (N_envs and
# N_RO of a --schedule, the minibatch size or count the command leaves out), and flags that args.json lacks.
flag_differences() { # args.json, command
    python3 - "$1" "$2" <<'PYTHON'
import ast, itertools, json, os, shlex, sys

recorded, words = json.load(open(sys.argv[1])), shlex.split(sys.argv[2])
script = next((i for i, word in enumerate(words) if word.endswith(".py")), 0)  # the flags follow the script
ARITHMETIC = (ast.Constant, ast.Tuple, ast.List, ast.Load, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)  # 2e-4 * 2
defaults, computed = {}, set()  # Args' defaults, and those computed from more than numbers (exp_name); none without it
if script and os.path.isfile(words[script]):
    for node in ast.walk(ast.parse(open(words[script]).read())):
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            for line in node.body:
                if isinstance(line, ast.AnnAssign) and line.value and "Suppress" not in ast.dump(line.annotation):
                    if all(isinstance(part, ARITHMETIC) for part in ast.walk(line.value)):
                        value = compile(ast.Expression(line.value), words[script], "eval")  # no ast.unparse: Python 3.8 too
                        defaults[line.target.id] = eval(value, {"__builtins__": {}})
                    else:
                        computed.add(line.target.id)


def same(there, here):
    try:
        return there is here if isinstance(here, bool) else float(here) == float(there)
    except (TypeError, ValueError):
        return str(there) == str(here)


given = {}
for i, word in enumerate(words[script + 1 :], start=script + 1):
    if word.startswith("--"):
        name, _, value = word[2:].partition("=")
        name = name.replace("-", "_")
        values = [value] if value else list(itertools.takewhile(lambda w: not w.startswith("--"), words[i + 1 :]))
        if not values:  # a boolean flag: --name or --no-name
            name, values = (name[3:], [False]) if name not in recorded and name.startswith("no_") else (name, [True])
        given[name] = values
derived = {"num_envs", "num_steps"} if "schedule" in given else set()
if "minibatch_size" in given:  # some scripts record the minibatch count they derive from a given size ...
    derived.add("num_minibatches")
elif "schedule" not in given and recorded.get("minibatch_size") and recorded.get("num_minibatches"):  # ... or the size
    if recorded["minibatch_size"] * recorded["num_minibatches"] == recorded["batch_size"]:  # (same split either way)
        derived.add("minibatch_size")
for name, default in defaults.items():
    given.setdefault(name, list(default) if isinstance(default, tuple) else [default])
differences = []
if script and recorded.get("script", os.path.basename(words[script])) != os.path.basename(words[script]):  # a variant's?
    differences.append(f"{recorded['script']} there / {os.path.basename(words[script])} here")
NOT_COMPARED = {"resume", "runs_dir", "torch_threads", "jax_cache_dir"}  # where and how fast, not what is learned
for name in sorted((computed - set(given) - {"exp_name"} - NOT_COMPARED) & set(recorded)):
    differences.append(f"--{name.replace('_', '-')} {recorded[name]} there / ? here (a computed default: give the flag)")
for name, values in given.items():
    if name in NOT_COMPARED | derived or name not in recorded or values == ["auto"]:
        continue
    there = recorded[name] if isinstance(recorded[name], list) else [recorded[name]]
    if not (len(there) == len(values) and all(map(same, there, values))):
        differences.append(f"--{name.replace('_', '-')} {' '.join(map(str, there))} there / {' '.join(map(str, values))} here")
print("; ".join(differences))
PYTHON
}

# Whether a process holds the run's lock: it trains the run. A shared lock for an instant, which only a trainer's
# exclusive one refuses (a lock file that cannot be read, a file system without locks, no python3 that runs: no).
lock_held() {
    [[ -f $1/lock ]] || return 1
    python3 -c 'import errno, fcntl, sys
try:
    lock = open(sys.argv[1])
except OSError:
    sys.exit(0)
try:
    fcntl.lockf(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
except OSError as error:
    sys.exit(3 if error.errno in (errno.EAGAIN, errno.EACCES) else 0)' "$1/lock" 2>/dev/null
    (($? == 3))
}

# Print the command to run for this line: as is, with --resume, nothing when finished, "RUNNING <run>" when a process
# trains its run, or "CONFLICT <why>" when the run under its name was trained with other flags.
resolve() {
    local command=$1 runs_dir env_id task_set env_size exp_name seed run_dir checkpoint="" differences
    env_id=$(flag_value --env-id "$command")
    if [[ -z $env_id && $command =~ (^|[[:space:]/])ppo_kinetix\.py([[:space:]]|$) ]]; then # its task: set and size
        task_set=$(flag_value --task-set "$command") env_size=$(flag_value --env-size "$command")
        [[ -n $task_set && -n $env_size ]] && env_id="Kinetix-$task_set-$env_size"
    fi
    exp_name=$(flag_value --exp-name "$command")
    [[ -z $exp_name && $command =~ ([^[:space:]/]+)\.py([[:space:]]|$) ]] && exp_name=${BASH_REMATCH[1]} # the scripts' default
    if [[ -z $env_id || -z $exp_name ]]; then
        echo "$command"
        return
    fi
    runs_dir=$(flag_value --runs-dir "$command")
    seed=$(flag_value --seed "$command")
    for run_dir in "${runs_dir:-runs}/${env_id}__${exp_name}__${seed:-1}__"*/; do
        if [[ ! -f $run_dir/done.json && ! -f $run_dir/checkpoint.pt ]]; then # new, or died before a checkpoint
            lock_held "$run_dir" && echo "RUNNING ${run_dir%/}" && return
            continue
        fi
        differences=""
        if [[ -f $run_dir/args.json ]] && ! differences=$(flag_differences "$run_dir/args.json" "$command" 2>&1); then
            echo "CONFLICT cannot compare the command's flags with ${run_dir}args.json: $(tail -n 1 <<<"$differences")"
            return
        elif [[ -n $differences ]]; then
            echo "CONFLICT ${run_dir%/} was trained with other flags ($differences): give this sweep another RUNS_DIR"
            return
        fi
        [[ -f $run_dir/done.json ]] && return
        lock_held "$run_dir" && echo "RUNNING ${run_dir%/}" && return
        [[ -f $run_dir/checkpoint.pt ]] && checkpoint=${run_dir}checkpoint.pt
    done
    if [[ -n $checkpoint ]]; then # a run started --init-from a checkpoint resumes from its own: the scripts take one
        local init_from='(.*[[:space:]])--init-from([[:space:]]+|=)[^[:space:]]+(([[:space:]].*)?)$'
        local init_optimizer='(.*[[:space:]])--init-optimizer(([[:space:]].*)?)$'
        while [[ $command =~ $init_from ]]; do command="${BASH_REMATCH[1]}${BASH_REMATCH[3]# }"; done
        while [[ $command =~ $init_optimizer ]]; do command="${BASH_REMATCH[1]}${BASH_REMATCH[2]# }"; done
        echo "${command%% } --resume $checkpoint"
    else
        echo "$command"
    fi
}

# $1 quoted for sh (sbatch --wrap runs /bin/sh, which may not read bash's $'...').
sh_quote() {
    printf "'%s'" "${1//\'/\'\\\'\'}"
}

# "PYTHON SCRIPT FLAGS" as NPROC processes of one run (see NPROC above).
with_torchrun() {
    local line=${1#"${1%%[![:space:]]*}"} # without leading blanks
    local python=${line%% *} rest=${line#* }
    if [[ $LAUNCHER == slurm ]]; then # \$ : expanded in the job, on its first node, at a port of the job's own
        echo "srun --ntasks-per-node=1 $python -m torch.distributed.run --nnodes=\$SLURM_NNODES --nproc-per-node=$NPROC" \
            "--rdzv-id=\$SLURM_JOB_ID --rdzv-backend=c10d --rdzv-endpoint=\$(scontrol show hostnames" \
            "\"\$SLURM_JOB_NODELIST\" | head -n 1):\$((29500 + SLURM_JOB_ID % 10000)) $rest"
    else
        echo "$python -m torch.distributed.run --standalone --nproc-per-node=$NPROC $rest"
    fi
}

mapfile -t lines < <(cat "${1:-/dev/stdin}")
commands=()
for line in "${lines[@]}"; do
    [[ -z ${line//[[:space:]]/} || $line =~ ^[[:space:]]*# ]] && continue
    ((NPROC > 1)) && [[ $LAUNCHER != exec ]] && line=$(with_torchrun "$line")
    commands+=("$line")
done

if [[ $LAUNCHER == print ]]; then
    printf '%s\n' "${commands[@]}"
    exit 0
fi

if [[ $LAUNCHER == exec ]]; then # one command, in this process: a Slurm job's, each time it starts
    if ((${#commands[@]} != 1)); then
        echo "error: LAUNCHER=exec runs one command, got ${#commands[@]}" >&2
        exit 2
    fi
    command=$(resolve "${commands[0]}")
    case $command in
    "") echo "skipped (finished): ${commands[0]}" && exit 0 ;;
    RUNNING*) echo "NOT RUN: ${command#RUNNING } is being trained by another process" >&2 && exit 1 ;;
    CONFLICT*) echo "NOT RUN: ${command#CONFLICT }" >&2 && exit 1 ;;
    esac
    echo "$command"
    exec bash -c "$command"
fi

gpus=()
if [[ $LAUNCHER == local ]]; then # (Slurm jobs keep the environment of their own node)
    if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then # set, even to none: those
        read -ra gpus <<<"${CUDA_VISIBLE_DEVICES//,/ }" # "0, 1", "3,,5": no empty entries
    elif listed=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null); then
        mapfile -t gpus < <(grep -xE '[0-9]+' <<<"$listed")
    fi
    if [[ -z $JOBS ]] && ((${#gpus[@]} >= 2 * NPROC)); then # every GPU busy, not one
        JOBS=$((${#gpus[@]} / NPROC))
        echo "JOBS=$JOBS: a worker per $NPROC of the ${#gpus[@]} GPUs (set JOBS to choose)"
    fi
    JOBS=${JOBS:-1}
    cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) # nproc: the cores this process may use
    workers=$((${#commands[@]} < JOBS ? ${#commands[@]} : JOBS)) # fewer commands than JOBS: the cores of the idle ones too
    threads=$((cores / ((workers > 0 ? workers : 1) * NPROC)))
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((threads > 0 ? threads : 1))}
fi

if ! mkdir -p "$LOG_DIR" || ! LOG_DIR=$(cd "$LOG_DIR" && pwd); then # absolute: a Slurm job reads its command there
    echo "error: LOG_DIR '$LOG_DIR' cannot be created" >&2
    exit 2
fi
failures="$LOG_DIR/failed.txt"
: >"$failures"
started=0 skipped=0 resumed=0 queued=0 running=0 queued_jobs="" worker_pids=()
if [[ $LAUNCHER == slurm ]] && ! queued_jobs=$(squeue --noheader --user="$(id -un)" --format=%j 2>&1); then
    echo "warning: squeue failed ($queued_jobs): commands whose jobs still wait may be submitted again" >&2
    queued_jobs=""
fi

run_local() { # index, command, its GPUs (none: all)
    trap : INT TERM # this worker outlives a Ctrl-C to report how its run ended (the run itself gets the default)
    local log="$LOG_DIR/$1.log"
    echo "[$1] $2" >"$log"
    if env ${3:+"CUDA_VISIBLE_DEVICES=$3"} bash -c "$2" >>"$log" 2>&1; then
        echo "[$1] done"
    else
        local status=$?
        local why=$( ((status == 130 || status == 143)) && echo ": interrupted, a re-run resumes it")
        echo "[$1] FAILED (exit $status$why), log: $log"
        printf 'exit %s | %s | log: %s\n' "$status" "$2" "$log" >>"$failures"
    fi
}

# Ctrl-C (SIGINT) or SIGTERM: start nothing more; the runs in flight get the signal too (each saves a checkpoint and
# stops), then the summary, and the exit status of the signal. A re-run resumes them.
stopped_by=""
stop() {
    stopped_by=$1
    for pid in $(jobs -p); do pkill "-$1" -P "$pid" 2>/dev/null; done
}
trap 'stop INT' INT
trap 'stop TERM' TERM

index=0
for line in "${commands[@]}"; do
    [[ -n $stopped_by ]] && break
    index=$((index + 1))
    job_name="sweep-$(printf '%s' "$line" | cksum | cut -d' ' -f1)"
    if [[ $LAUNCHER == slurm ]] && grep -qxF "$job_name" <<<"$queued_jobs"; then
        echo "[$index] skipped (queued or running as Slurm job $job_name): $line"
        queued=$((queued + 1))
        continue
    fi
    # locally, a free worker first: a run that another launcher on this RUNS_DIR started meanwhile is seen
    [[ $LAUNCHER == local ]] && while [[ -z $stopped_by ]] && (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done
    [[ -n $stopped_by ]] && index=$((index - 1)) && break
    command=$(resolve "$line")
    if [[ $command == CONFLICT* ]]; then
        echo "[$index] NOT RUN: ${command#CONFLICT }"
        printf 'not run | %s | %s\n' "$line" "${command#CONFLICT }" >>"$failures"
        continue
    fi
    if [[ -z $command ]]; then
        echo "[$index] skipped (finished): $line"
        skipped=$((skipped + 1))
        continue
    fi
    if [[ $command == RUNNING* ]]; then
        echo "[$index] skipped (being trained by another process: ${command#RUNNING }): $line"
        running=$((running + 1))
        continue
    fi
    [[ $command == *" --resume "* && $line != *" --resume "* ]] && resumed=$((resumed + 1))
    started=$((started + 1))
    if [[ $LAUNCHER == slurm ]]; then
        printf '%s\n' "$line" >"$LOG_DIR/$job_name.command" # the job checks its run at each start: LAUNCHER=exec
        wrap="exec env LAUNCHER=exec bash $(sh_quote "$(cd "$(dirname "$0")" && pwd)/launch.sh")"
        wrap+=" $(sh_quote "$LOG_DIR/$job_name.command")"
        # shellcheck disable=SC2086 # SBATCH_ARGS is a list of arguments
        if job=$(sbatch --parsable $SBATCH_ARGS $( ((NPROC > 1)) && echo --ntasks-per-node=1) --job-name="$job_name" \
            --output="$LOG_DIR/$index-%j.log" --wrap="$wrap" 2>&1); then
            echo "[$index] submitted job $job: $command"
        else
            echo "[$index] FAILED to submit: $job"
            printf 'sbatch | %s | %s\n' "$command" "${job//$'\n'/ }" >>"$failures"
        fi
    else
        devices=""
        if ((${#gpus[@]} > 1)); then # the GPUs of a free worker slot
            busy=" $(jobs -rp | tr '\n' ' ')"
            for ((slot = 0; slot < JOBS; slot++)); do [[ $busy == *" ${worker_pids[slot]:-none} "* ]] || break; done
            for ((i = 0; i < NPROC; i++)); do devices+=${devices:+,}${gpus[(slot * NPROC + i) % ${#gpus[@]}]}; done
        fi
        echo "[$index] start${devices:+ on GPU $devices}: $command"
        run_local "$index" "$command" "$devices" &
        [[ -n $devices ]] && worker_pids[slot]=$!
    fi
done
while [[ -n $(jobs -rp) ]]; do wait; done # a signal ends a wait early: the runs in flight still finish their checkpoint

waiting=$( ((queued)) && echo " and $queued queued or running")$( ((running)) && echo ", $running being trained")
echo "launched $started ($resumed resumed from a checkpoint), skipped $skipped finished$waiting; logs in $LOG_DIR"
if [[ -s $failures ]]; then
    echo "$(wc -l <"$failures") command(s) failed:"
    cat "$failures"
fi
if [[ -n $stopped_by ]]; then
    echo "stopped by SIG$stopped_by: $((${#commands[@]} - index)) command(s) not started; a re-run resumes the interrupted"
    [[ $stopped_by == INT ]] && exit 130
    exit 143
fi
[[ ! -s $failures ]] # exit 1 when a command failed
