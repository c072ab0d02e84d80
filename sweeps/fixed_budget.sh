#!/usr/bin/env bash
# Fixed budget (paper Fig. 1a and the reviewers' grid): is it better to collect a batch of
# N_envs x N_RO = 1024 transitions with many short rollouts or few long ones?
# PPO, (N_envs, N_RO) in (8,128) (16,64) (32,32) (64,16) (128,8).
#
#   bash sweeps/fixed_budget.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/fixed_budget.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/fixed_budget --baseline ppo_envs8_steps128   # P(X > Table 1's)
#
# CPU default: GAMES=Breakout SEEDS="1 2" TOTAL_TIMESTEPS=20480 (10 runs of ~1.5 min on 2 cores).
# Paper (SCALE=paper): GAMES = the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000
# (250 runs of 100M steps). Set any variable on the command line, and LAUNCHER, JOBS,
# SBATCH_ARGS for sweeps/launch.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1 2}" "${TOTAL_TIMESTEPS:=20480}"
: "${SHAPES:=8x128 16x64 32x32 64x16 128x8}" "${RUNS_DIR:=runs/fixed_budget}" "${PYTHON:=.venv/bin/python}"
: "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for shape in $SHAPES; do
            envs=${shape%x*} steps=${shape#*x}
            echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                "--total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_envs${envs}_steps${steps}" \
                "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
        done
    done
done | bash sweeps/launch.sh
