#!/usr/bin/env bash
# The launcher every sweep uses: reads commands, one per line, from a file or stdin.
#
#   bash sweeps/launch.sh commands.txt
#   some_sweep_loop | LAUNCHER=print bash sweeps/launch.sh
#
# Environment:
#   LAUNCHER      local (default): run with JOBS parallel workers on this machine
#                 print: only print the commands (a dry run; nothing is checked or started)
#                 slurm: submit each command as one job with `sbatch --wrap`
#   JOBS          local parallel workers (default 1)
#   SBATCH_ARGS   extra sbatch arguments for LAUNCHER=slurm, e.g. "--gres=gpu:1 --time=24:00:00"
#   LOG_DIR       where each command's output goes (default sweep_logs/<date-time>)
#
# A command that names its run (--env-id, --exp-name and optionally --seed and --runs-dir,
# as every sweep script does) is matched to runs/<env_id>__<exp_name>__<seed>__<time>/:
#   - a run directory with done.json (the scripts' completion marker) -> skipped;
#   - one with checkpoint.pt (interrupted, pre-empted, crashed) -> resumed with --resume;
#   - otherwise the command starts a new run.
# Failed commands are listed at the end with their log files; the exit status is 1 then.
set -uo pipefail

LAUNCHER=${LAUNCHER:-local}
JOBS=${JOBS:-1}
SBATCH_ARGS=${SBATCH_ARGS:-}
LOG_DIR=${LOG_DIR:-sweep_logs/$(date +%Y%m%d-%H%M%S)}

case $LAUNCHER in local | print | slurm) ;; *)
    echo "error: LAUNCHER must be local, print or slurm, got '$LAUNCHER'" >&2
    exit 2
    ;;
esac
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
    echo "error: JOBS must be a positive integer, got '$JOBS'" >&2
    exit 2
fi
if (($# > 1)) || { (($# == 1)) && [[ ! -r $1 ]]; }; then
    echo "error: usage: bash sweeps/launch.sh [COMMANDS_FILE] (or commands on stdin); '${1:-}' is not readable" >&2
    exit 2
fi

# The value of a flag in a command ("--seed 3" or "--seed=3"), empty when absent.
flag_value() {
    local pattern="(^|[[:space:]])$1[[:space:]=]+([^[:space:]]+)"
    [[ $2 =~ $pattern ]] && echo "${BASH_REMATCH[2]}"
}

# Print the command to run for this line: as is, with --resume, or nothing when finished.
resolve() {
    local command=$1 runs_dir env_id exp_name seed run_dir checkpoint=""
    env_id=$(flag_value --env-id "$command")
    exp_name=$(flag_value --exp-name "$command")
    if [[ -z $env_id || -z $exp_name ]]; then
        echo "$command"
        return
    fi
    runs_dir=$(flag_value --runs-dir "$command")
    seed=$(flag_value --seed "$command")
    for run_dir in "${runs_dir:-runs}/${env_id}__${exp_name}__${seed:-1}__"*/; do
        [[ -d $run_dir ]] || continue
        [[ -f $run_dir/done.json ]] && return
        [[ -f $run_dir/checkpoint.pt ]] && checkpoint=${run_dir}checkpoint.pt
    done
    if [[ -n $checkpoint ]]; then
        echo "$command --resume $checkpoint"
    else
        echo "$command"
    fi
}

mapfile -t lines < <(cat "${1:-/dev/stdin}")
commands=()
for line in "${lines[@]}"; do
    [[ -z ${line//[[:space:]]/} || $line =~ ^[[:space:]]*# ]] && continue
    commands+=("$line")
done

if [[ $LAUNCHER == print ]]; then
    printf '%s\n' "${commands[@]}"
    exit 0
fi

mkdir -p "$LOG_DIR"
failures="$LOG_DIR/failed.txt"
: >"$failures"
started=0 skipped=0 resumed=0

run_local() { # index, command
    local log="$LOG_DIR/$1.log"
    echo "[$1] $2" >"$log"
    if bash -c "$2" >>"$log" 2>&1; then
        echo "[$1] done"
    else
        local status=$?
        echo "[$1] FAILED (exit $status), log: $log"
        printf 'exit %s | %s | log: %s\n' "$status" "$2" "$log" >>"$failures"
    fi
}

index=0
for line in "${commands[@]}"; do
    index=$((index + 1))
    command=$(resolve "$line")
    if [[ -z $command ]]; then
        echo "[$index] skipped (finished): $line"
        skipped=$((skipped + 1))
        continue
    fi
    [[ $command == *" --resume "* && $line != *" --resume "* ]] && resumed=$((resumed + 1))
    started=$((started + 1))
    if [[ $LAUNCHER == slurm ]]; then
        # shellcheck disable=SC2086 - SBATCH_ARGS is a list of arguments
        if job=$(sbatch --parsable $SBATCH_ARGS --job-name="sweep-$index" --output="$LOG_DIR/$index-%j.log" \
            --wrap="$command" 2>&1); then
            echo "[$index] submitted job $job: $command"
        else
            echo "[$index] FAILED to submit: $job"
            printf 'sbatch | %s | %s\n' "$command" "$job" >>"$failures"
        fi
    else
        while (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done
        echo "[$index] start: $command"
        run_local "$index" "$command" &
    fi
done
wait

echo "launched $started ($resumed resumed from a checkpoint), skipped $skipped finished; logs in $LOG_DIR"
if [[ -s $failures ]]; then
    echo "$(wc -l <"$failures") command(s) failed:"
    cat "$failures"
    exit 1
fi
