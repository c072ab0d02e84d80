#!/usr/bin/env bash
# Data scaling (paper Fig. 1b; the rebuttal's Fig. 5 with N_envs on the x-axis, and its table of N_envs 1, 2, 4, 8,
# 16 at N_RO 128): from PPO's (N_envs, N_RO) = (8, 128), grow the batch by k in {1,2,4,8,16} either with more
# environments (8k, 128) or with longer rollouts (8, 128k), and shrink it with fewer environments (FEWER_ENVS x 128).
# Same runs give the learning dynamics figures (Fig. 3, 4, 10, 17): every metrics/ tag is logged.
#
#   bash sweeps/data_scaling.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/data_scaling.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/data_scaling   # score_vs_batch.png: both scalings on one axis
#
# CPU default: GAMES=Breakout SEEDS="1 2" TOTAL_TIMESTEPS=16384 MULTIPLIERS="1 2 4" FEWER_ENVS="4".
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000,
# MULTIPLIERS="1 2 4 8 16", FEWER_ENVS="1 2 4" (the rebuttal's table; 600 runs of 100M steps; at 1 env a run is
# 781,250 iterations of 128 steps: the slowest of the sweep). The 4 minibatches of every run split a batch of 128
# (1 env) into minibatches of 32.
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${MULTIPLIERS:=1 2 4 8 16}" "${FEWER_ENVS:=1 2 4}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1 2}" "${TOTAL_TIMESTEPS:=16384}" "${MULTIPLIERS:=1 2 4}" "${FEWER_ENVS:=4}"
: "${RUNS_DIR:=runs/data_scaling}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
for envs in $FEWER_ENVS; do
    if ! [[ $envs =~ ^[1-7]$ ]]; then # 8 and more are MULTIPLIERS' (8k, 128)
        echo "error: FEWER_ENVS holds '$envs': give N_envs below 8 (e.g. 1 2 4); MULTIPLIERS gives 8 and more" >&2
        exit 2
    fi
done

for game in $GAMES; do
    for seed in $SEEDS; do
        shapes=""
        for envs in $FEWER_ENVS; do shapes="$shapes ${envs}x128"; done
        for k in $MULTIPLIERS; do
            # k = 1 is the shared (8, 128) baseline; run it once
            shapes="$shapes $((8 * k))x128"
            ((k > 1)) && shapes="$shapes 8x$((128 * k))"
        done
        for shape in $shapes; do
            envs=${shape%x*} steps=${shape#*x}
            echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                "--total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_envs${envs}_steps${steps}" \
                "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
        done
    done
done | bash sweeps/launch.sh
