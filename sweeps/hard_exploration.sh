#!/usr/bin/env bash
# Hard exploration (paper Fig. 15, 16): does more parallel data help where exploration is
# the bottleneck? On the hard-exploration games, PPO+RND N_envs vs N_RO around RND's (128, 128)
# (Fig. 16), and plain PPO with more environments from Table 1's (8, 128) (Fig. 15).
#
#   bash sweeps/hard_exploration.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/hard_exploration.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/hard_exploration
#
# CPU default: GAMES=MontezumaRevenge SEEDS="1" TOTAL_TIMESTEPS=32768 SHAPES="16x64 32x32" (PPO_SHAPES and
# PPO_TOTAL_TIMESTEPS: the same).
# Paper scale (SCALE=paper): GAMES=$HARD_EXPLORATION (sweeps/games.sh), SEEDS="1 2 3 4 5" (Appendix A).
# PPO+RND (Fig. 16, whose budget and grid the paper does not give; ours): TOTAL_TIMESTEPS=50000000,
# SHAPES="64x128 128x64 128x128 256x128 128x256" (the batch halved or doubled by N_envs or by N_RO).
# PPO (Fig. 15: "see Section 4 for training details"): PPO_TOTAL_TIMESTEPS=100000000,
# PPO_SHAPES="8x128 16x128 32x128 64x128 128x128" (N_envs x 1 to x 16 from Table 1's 8 x 128, as Fig. 1b).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$HARD_EXPLORATION}" "${SEEDS:=1 2 3 4 5}" "${OBS_NORM_INIT:=50}"
    : "${TOTAL_TIMESTEPS:=50000000}" "${SHAPES:=64x128 128x64 128x128 256x128 128x256}"
    : "${PPO_TOTAL_TIMESTEPS:=100000000}" "${PPO_SHAPES:=8x128 16x128 32x128 64x128 128x128}"
fi
: "${GAMES:=MontezumaRevenge}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=32768}" "${SHAPES:=16x64 32x32}"
: "${PPO_TOTAL_TIMESTEPS:=$TOTAL_TIMESTEPS}" "${PPO_SHAPES:=$SHAPES}"
: "${OBS_NORM_INIT:=2}" "${RUNS_DIR:=runs/hard_exploration}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for shape in $SHAPES; do
            envs=${shape%x*} steps=${shape#*x}
            echo "$PYTHON ppo_rnd_atari.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                "--num-iterations-obs-norm-init $OBS_NORM_INIT --total-timesteps $TOTAL_TIMESTEPS" \
                "--exp-name rnd_envs${envs}_steps${steps} --runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
        done
        for shape in $PPO_SHAPES; do  # plain PPO (EnvPool defaults: no sticky actions, unlike the RND runs)
            envs=${shape%x*} steps=${shape#*x}
            echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                "--total-timesteps $PPO_TOTAL_TIMESTEPS --exp-name ppo_envs${envs}_steps${steps}" \
                "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
        done
    done
done | bash sweeps/launch.sh
