#!/usr/bin/env bash
# Restart with another outer step size (Beukman et al. 2026, Fig. 3a): does a run that plateaued under a weak
# regularisation recover once it gets a stronger one, and does a well-regularised run fall to the weak plateau? Each
# base run trains the first half of the budget with one PPO-EWMA centre of mass (COMS; with CLIPS, standard PPO's clip
# epsilon), then new runs start from its final checkpoint (--init-from, with --init-optimizer: Adam's moments too)
# with each value, its own included (the control: the restart itself, new envs and the RNG seeded afresh, changes
# nothing else), for the second half. Names: ewma_com1_base, ewma_com64_from1 (a restart with COM 64 from the COM 1
# base).
#
#   bash sweeps/restart.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/restart.sh      # the paper's commands (both stages)
#   .venv/bin/python sweeps/aggregate.py report runs/restart
#
# The restarts' curves start at their own step 0: their step s is the base's TOTAL_TIMESTEPS / 2 + s. Every run
# trains at a constant LR (--no-anneal-lr): a half-budget base run is then the first half of a whole run (with the
# Atari default, the LR annealed to 0 over the budget, it would end at LR 0 and its restart start again from the top),
# and its last checkpoint, written when it finishes, is that run's mid-point.
# Two stages: the base runs through sweeps/launch.sh (which waits for them), then each finished base's checkpoint.pt is
# copied to RUNS_DIR/init/<env>__<base>__<seed>.pt (a fixed path: the restarts' commands can be printed and compared
# before it exists) and the restarts run. LAUNCHER=slurm submits the base jobs and returns: run this sweep again once
# they have finished (it skips them, as any re-run does) and it submits the restarts; a restart whose base is not
# finished is left for a later run, with a notice. LAUNCHER=print prints both stages and runs nothing. The logs of the
# stages go to LOG_DIR/bases and LOG_DIR/restarts.
#
# CPU default: GAMES=Breakout SEEDS="1" TOTAL_TIMESTEPS=16384 COMS="1 64" CLIPS="" (2 bases + 4 restarts of 8,192
#   steps each).
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000, COMS="1 64" (the weakest and
#   strongest non-zero COMs of ewma_recipe.sh: the paper's Fig. 3a is on Kinetix, its values only in the plot),
#   CLIPS="" (Fig. 3a changes the COM only; CLIPS="0.1 0.3" adds PPO's clip epsilon restarts): 300 runs of 50M steps.
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=16384}" "${COMS=1 64}" "${CLIPS=}"
: "${RUNS_DIR:=runs/restart}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
HALF=$((TOTAL_TIMESTEPS / 2))

# "script flag name" for each family: PPO-EWMA's centre of mass, PPO's clip epsilon
families=()
[[ -n ${COMS// /} ]] && families+=("ppo_ewma_atari.py --ewma-com ewma_com")
[[ -n ${CLIPS// /} ]] && families+=("ppo_atari_envpool.py --clip-coef ppo_clip")

# One command: a base run (no source) or a restart from the base of value $from; $game, $seed are the loops'.
run_command() {
    local script=$1 flag=$2 prefix=$3 value=$4 from=${5:-} name init=""
    if [[ -z $from ]]; then
        name="${prefix}${value}_base"
    else
        name="${prefix}${value}_from$from"
        init="--init-from $RUNS_DIR/init/$game-v5__${prefix}${from}_base__$seed.pt --init-optimizer "
    fi
    echo "$PYTHON $script --env-id $game-v5 --seed $seed $flag $value --no-anneal-lr --total-timesteps $HALF" \
        "$init--exp-name $name --runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
}

each_value() { # calls $1 with: script flag prefix value, for every family, game, seed and value
    local family script flag prefix values value
    for family in "${families[@]}"; do
        read -r script flag prefix <<<"$family"
        values=$COMS && [[ $prefix == ppo_clip ]] && values=$CLIPS
        for game in $GAMES; do
            for seed in $SEEDS; do
                for value in $values; do "$1" "$script" "$flag" "$prefix" "$value" "$values"; done
            done
        done
    done
}

base() { run_command "$1" "$2" "$3" "$4"; }
restarts() { # from the base of value $4, one restart per value; printed only once that base's checkpoint is there
    local to
    if [[ $LAUNCHER != print && ! -f $RUNS_DIR/init/$game-v5__$3$4_base__$seed.pt ]]; then
        echo "notice: $game-v5 $3$4_base (seed $seed) has not finished: its restarts wait for a re-run of this sweep" >&2
        return
    fi
    for to in $5; do run_command "$1" "$2" "$3" "$to" "$4"; done
}
copy_checkpoint() { # a finished base's last checkpoint to its fixed path (once: the restarts record that file)
    local target=$RUNS_DIR/init/$game-v5__$3$4_base__$seed.pt run_dir
    for run_dir in "$RUNS_DIR/$game-v5__$3$4_base__${seed}__"*/; do
        if [[ ! -f $target && -f $run_dir/done.json && -f $run_dir/checkpoint.pt ]]; then
            mkdir -p "$RUNS_DIR/init" && cp "$run_dir/checkpoint.pt" "$target.tmp" && mv "$target.tmp" "$target"
        fi
    done
}

LAUNCHER=${LAUNCHER:-local}
LOG_DIR=${LOG_DIR:-sweep_logs/$(date +%Y%m%d-%H%M%S)-$$} # the two stages' logs in LOG_DIR/bases and LOG_DIR/restarts
status=0
each_value base | LOG_DIR=$LOG_DIR/bases bash sweeps/launch.sh || status=$?
[[ $LAUNCHER != print ]] && each_value copy_checkpoint
each_value restarts | LOG_DIR=$LOG_DIR/restarts bash sweeps/launch.sh || status=$?
exit $status
