#!/usr/bin/env bash
# Decoupled networks (paper Fig. 5): does giving the actor and the critic their own
# encoder change how PPO scales with N_envs? Shared vs --separate-networks x N_envs,
# N_RO = 128.
#
#   bash sweeps/decoupled.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/decoupled.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/decoupled
#
# CPU default: GAMES=Breakout SEEDS="1 2" TOTAL_TIMESTEPS=16384 NUM_ENVS="8 32".
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000,
# NUM_ENVS="8 16 32 64 128" (500 runs of 100M steps).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${NUM_ENVS:=8 16 32 64 128}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1 2}" "${TOTAL_TIMESTEPS:=16384}" "${NUM_ENVS:=8 32}"
: "${RUNS_DIR:=runs/decoupled}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for envs in $NUM_ENVS; do
            for network in shared separate; do
                flag=""
                [[ $network == separate ]] && flag="--separate-networks"
                echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps 128 $flag" \
                    "--total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_${network}_envs${envs}" \
                    "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
