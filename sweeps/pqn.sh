#!/usr/bin/env bash
# PQN data scaling (paper Fig. 6, 13, 14): the data-scaling grid for a value-based method
# without replay buffer or target network. From (N_envs, N_RO) = (8, 128), more
# environments (8k, 128) or longer rollouts (8, 128k), k in {1, 2, 4, 8, 16}.
#
#   bash sweeps/pqn.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/pqn.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/pqn
#
# CPU default: GAMES=Breakout SEEDS="1 2" TOTAL_TIMESTEPS=16384 MULTIPLIERS="1 2 4", EXPLORATION="" (pqn_atari.py's
#   defaults: epsilon 1 -> 0.01 over the first 10 % of the steps, CleanRL's).
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000,
# MULTIPLIERS="1 2 4 8 16" (450 runs of 100M steps), EXPLORATION="--exploration-fraction 0.0025 --end-e 0.011":
# Table 1's PQN exploration, epsilon decayed over 250,000 steps (0.25 % of 100M) to 0.011 (its PQN column; the 0.01
# beside it is the PPO column's, which has no epsilon). The text says the runs used CleanRL's PQN, whose defaults
# are the CPU version's: EXPLORATION= (empty) runs those at paper scale.
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${MULTIPLIERS:=1 2 4 8 16}"
    : "${EXPLORATION=--exploration-fraction 0.0025 --end-e 0.011}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1 2}" "${TOTAL_TIMESTEPS:=16384}" "${MULTIPLIERS:=1 2 4}"
: "${EXPLORATION=}" "${RUNS_DIR:=runs/pqn}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for k in $MULTIPLIERS; do
            shapes="$((8 * k))x128"
            ((k > 1)) && shapes="$shapes 8x$((128 * k))"
            for shape in $shapes; do
                envs=${shape%x*} steps=${shape#*x}
                echo "$PYTHON pqn_atari.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                    "--total-timesteps $TOTAL_TIMESTEPS $EXPLORATION --exp-name pqn_envs${envs}_steps${steps}" \
                    "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
