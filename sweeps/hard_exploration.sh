#!/usr/bin/env bash
# Hard exploration (paper Fig. 15, 16): does more parallel data help where exploration is
# the bottleneck? PPO and PPO+RND on the hard-exploration games, N_envs vs N_RO around
# RND's (128, 128).
#
#   bash sweeps/hard_exploration.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/hard_exploration.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/hard_exploration
#
# CPU default: GAMES=MontezumaRevenge SEEDS="1" TOTAL_TIMESTEPS=32768 SHAPES="16x64 32x32".
# Paper scale (SCALE=paper): GAMES=$HARD_EXPLORATION (sweeps/games.sh), SEEDS="1 2 3 4 5" (Appendix A);
# our choices, as the paper gives no budget or grid for these figures: TOTAL_TIMESTEPS=50000000,
# SHAPES="32x128 64x128 128x128 128x64 128x256" (Fig. 15's PPO is run on RND's shapes, not from 8 x 128).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$HARD_EXPLORATION}" "${SEEDS:=1 2 3 4 5}"
    : "${TOTAL_TIMESTEPS:=50000000}" "${SHAPES:=32x128 64x128 128x128 128x64 128x256}" "${OBS_NORM_INIT:=50}"
fi
: "${GAMES:=MontezumaRevenge}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=32768}" "${SHAPES:=16x64 32x32}"
: "${OBS_NORM_INIT:=2}" "${RUNS_DIR:=runs/hard_exploration}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for shape in $SHAPES; do
            envs=${shape%x*} steps=${shape#*x}
            echo "$PYTHON ppo_rnd_atari.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                "--num-iterations-obs-norm-init $OBS_NORM_INIT --total-timesteps $TOTAL_TIMESTEPS" \
                "--exp-name rnd_envs${envs}_steps${steps} --runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
            # plain PPO on the same data shape (EnvPool defaults: no sticky actions, unlike the RND runs)
            echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                "--total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_envs${envs}_steps${steps}" \
                "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
        done
    done
done | bash sweeps/launch.sh
