#!/usr/bin/env bash
# Beyond the study (issue 11): change N_envs x N_RO during training, or adapt PPO's outer step to a target
# data-to-divergence ratio. At a fixed budget and a fixed batch of 1024:
#   fixed_8x128, fixed_128x8      the two ends of the paper's Fig. 1a grid, for reference;
#   grow, shrink                  N_envs 8 -> 32 -> 128 (N_RO 128 -> 32 -> 8) over thirds of the budget, and back;
#   target_ddr                    8 x 128 with --target-ddr (PPO, PPO-EWMA; PQN has no clipping epsilon to adapt).
# aggregate.py report groups them by configuration and plots N_envs, clip_coef, DDR and score over training.
#
#   bash sweeps/schedules.sh                                   # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/schedules.sh        # the long version's commands
#   .venv/bin/python sweeps/aggregate.py report runs/schedules --baseline ppo_fixed_8x128     # P(X > no schedule)
#
# CPU default: GAMES=Breakout SEEDS="1 2" TOTAL_TIMESTEPS=20480 ALGOS=ppo (10 runs of ~1 min on 2 cores);
#   RESULTS.md's demonstration: CONFIGS="fixed_8x128 grow" TOTAL_TIMESTEPS=500000 JOBS=2, then
#   CONFIGS=target_ddr TARGET_DDR_FINAL=1000000 with the same budget (the commands are in RESULTS.md).
# SCALE=paper: the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000, ALGOS="ppo ewma pqn".
# TARGET_DDR (default 100000, batch / KL) and TARGET_DDR_FINAL (unset: constant) set the target.
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${ALGOS:=ppo ewma pqn}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1 2}" "${TOTAL_TIMESTEPS:=20480}" "${ALGOS:=ppo}"
: "${CONFIGS:=fixed_8x128 fixed_128x8 grow shrink target_ddr}" "${TARGET_DDR:=100000}" "${TARGET_DDR_FINAL:=}"
: "${RUNS_DIR:=runs/schedules}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
declare -A SCRIPT=([ppo]=ppo_atari_envpool.py [ewma]=ppo_ewma_atari.py [pqn]=pqn_atari.py)
declare -A FLAGS=(
    [fixed_8x128]="--num-envs 8 --num-steps 128"
    [fixed_128x8]="--num-envs 128 --num-steps 8"
    [grow]="--schedule 0:8x128,0.33:32x32,0.67:128x8"
    [shrink]="--schedule 0:128x8,0.33:32x32,0.67:8x128"
    [target_ddr]="--num-envs 8 --num-steps 128 --target-ddr $TARGET_DDR"
)
FLAGS[target_ddr]+="${TARGET_DDR_FINAL:+ --target-ddr-final $TARGET_DDR_FINAL}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for algo in $ALGOS; do
            for config in $CONFIGS; do
                [[ $config == target_ddr && $algo == pqn ]] && continue # no policy ratio, no clipping: nothing to adapt
                echo "$PYTHON ${SCRIPT[$algo]} --env-id $game-v5 --seed $seed ${FLAGS[$config]}" \
                    "--total-timesteps $TOTAL_TIMESTEPS --exp-name ${algo}_$config --runs-dir $RUNS_DIR" \
                    "--checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
