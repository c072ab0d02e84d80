#!/usr/bin/env bash
# State-space coverage (paper Fig. 2, 9): do many parallel environments visit more of the
# state space than long rollouts of few? PPO at (N_envs, N_RO) = (8, 128) and (128, 8)
# with --save-embeddings; aggregate.py coverage projects the saved features with UMAP and
# counts occupied grid cells.
#
#   bash sweeps/coverage.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/coverage.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py coverage runs/coverage
#
# CPU default: GAMES=Breakout SEEDS="1" TOTAL_TIMESTEPS=20480, embeddings every METRICS_INTERVAL=2 iterations.
# Paper (SCALE=paper): GAMES=$COVERAGE_GAMES (illustrative games, sweeps/games.sh),
# SEEDS="1 2 3 4 5" (the paper's five seeds of every setup, its Appendix A), TOTAL_TIMESTEPS=100000000 (the
# paper's training budget, Sec. 4), METRICS_INTERVAL=100 and CHECKPOINT_INTERVAL=1000: 256 states of every 100th
# iteration, 250k a run (about 256 MB of float16 features), which each checkpoint rewrites (embeddings.npz).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$COVERAGE_GAMES}" "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}"
    : "${METRICS_INTERVAL:=100}" "${CHECKPOINT_INTERVAL:=1000}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=20480}" "${SHAPES:=8x128 128x8}"
: "${METRICS_INTERVAL:=2}" "${CHECKPOINT_INTERVAL:=20}"
: "${RUNS_DIR:=runs/coverage}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for shape in $SHAPES; do
            envs=${shape%x*} steps=${shape#*x}
            echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                "--save-embeddings --metrics-interval $METRICS_INTERVAL --total-timesteps $TOTAL_TIMESTEPS" \
                "--exp-name ppo_envs${envs}_steps${steps} --runs-dir $RUNS_DIR --checkpoint-interval $CHECKPOINT_INTERVAL" \
                "$EXTRA_FLAGS"
        done
    done
done | bash sweeps/launch.sh
