#!/usr/bin/env bash
# Epochs (paper Fig. 1c): does reusing each batch more often substitute for more parallel
# data? PPO with update epochs {4, 8, 16} x N_envs {8, 16, 32}, N_RO = 128.
#
#   bash sweeps/epochs.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/epochs.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/epochs
#
# CPU default: GAMES=Breakout SEEDS="1 2" TOTAL_TIMESTEPS=16384 EPOCHS="4 8" NUM_ENVS="8 16".
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000,
# EPOCHS="4 8 16", NUM_ENVS="8 16 32" (450 runs of 100M steps).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${EPOCHS:=4 8 16}" "${NUM_ENVS:=8 16 32}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1 2}" "${TOTAL_TIMESTEPS:=16384}" "${EPOCHS:=4 8}" "${NUM_ENVS:=8 16}"
: "${RUNS_DIR:=runs/epochs}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for epochs in $EPOCHS; do
            for envs in $NUM_ENVS; do
                echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps 128" \
                    "--update-epochs $epochs --total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_envs${envs}_epochs${epochs}" \
                    "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
