#!/usr/bin/env bash
# Procgen (paper Fig. 8): the data-scaling question on procedurally generated levels.
# PPO + IMPALA CNN on BigFish and StarPilot (easy), from (N_envs, N_RO) = (64, 256),
# batch x k by more environments or longer rollouts.
#
#   bash sweeps/procgen.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/procgen.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/procgen
#
# CPU default: GAMES=Bigfish SEEDS="1" TOTAL_TIMESTEPS=8192 BASE=16x64 MULTIPLIERS="1 2"
#   (the IMPALA CNN runs ~200 SPS on 2 CPU cores).
# Paper scale (SCALE=paper): GAMES=$PROCGEN_GAMES (sweeps/games.sh), SEEDS="1 2 3 4 5" (Appendix A),
#   TOTAL_TIMESTEPS=25000000 and BASE=64x256 (CleanRL's ppo_procgen.py defaults: the paper's Table 2 gives the network
#   and optimiser, neither of these), MULTIPLIERS="1 2 4" (our grid: the paper gives none).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$PROCGEN_GAMES}" "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=25000000}"
    : "${BASE:=64x256}" "${MULTIPLIERS:=1 2 4}"
fi
: "${GAMES:=Bigfish}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=8192}" "${BASE:=16x64}" "${MULTIPLIERS:=1 2}"
: "${RUNS_DIR:=runs/procgen}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
base_envs=${BASE%x*} base_steps=${BASE#*x}

for game in $GAMES; do
    for seed in $SEEDS; do
        for k in $MULTIPLIERS; do
            shapes="$((base_envs * k))x$base_steps"
            ((k > 1)) && shapes="$shapes ${base_envs}x$((base_steps * k))"
            for shape in $shapes; do
                envs=${shape%x*} steps=${shape#*x}
                echo "$PYTHON ppo_procgen.py --env-id ${game}Easy-v0 --seed $seed --num-envs $envs --num-steps $steps" \
                    "--total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_envs${envs}_steps${steps}" \
                    "--runs-dir $RUNS_DIR --checkpoint-interval 10 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
