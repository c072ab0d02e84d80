#!/usr/bin/env bash
# PPO-EWMA and the large-batch recipe (Beukman et al. 2026, Fig. 5a and 7a at a fixed step budget, 8, 9; not
# Fig. 6's epochs nor the PPO clip panels 5b-7b): as N_envs grows,
#  (a) PPO-EWMA's centre of mass x clip x batch, and
#  (b) how to spend a bigger batch with PPO: "more minibatches" (fixed minibatch size),
#      "bigger minibatches" (fixed number of minibatches), "bigger + sqrt LR".
# aggregate.py report plots final return against the data-to-divergence ratio (DDR).
#
#   bash sweeps/ewma_recipe.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/ewma_recipe.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/ewma_recipe
#
# CPU default: GAMES=Breakout SEEDS="1" TOTAL_TIMESTEPS=16384 NUM_ENVS="8 32" COMS="0 8"
#   CLIPS="0.1".
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000,
#   NUM_ENVS="8 32 128", COMS="0 1 8 64", CLIPS="0.1 0.2".
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${NUM_ENVS:=8 32 128}" "${COMS:=0 1 8 64}"
    : "${CLIPS:=0.1 0.2}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=16384}" "${NUM_ENVS:=8 32}" "${COMS:=0 8}" "${CLIPS:=0.1}"
: "${RUNS_DIR:=runs/ewma_recipe}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for envs in $NUM_ENVS; do
            common="--env-id $game-v5 --seed $seed --num-envs $envs --num-steps 128 --total-timesteps $TOTAL_TIMESTEPS"
            common="$common --runs-dir $RUNS_DIR --checkpoint-interval 20"
            for com in $COMS; do
                for clip in $CLIPS; do
                    echo "$PYTHON ppo_ewma_atari.py $common --ewma-com $com --clip-coef $clip" \
                        "--exp-name ewma_com${com}_clip${clip}_envs${envs} $EXTRA_FLAGS"
                done
            done
            echo "$PYTHON ppo_atari_envpool.py $common --num-minibatches 4" \
                "--exp-name ppo_bigger-minibatches_envs${envs} $EXTRA_FLAGS"
            # At 8 envs all three are PPO's defaults (4 minibatches of 256 = (8 x 128) / 4, the LR unscaled): the run above
            # stands for the three lines there, each training once
            [[ $envs == 8 ]] && continue
            echo "$PYTHON ppo_atari_envpool.py $common --minibatch-size 256" \
                "--exp-name ppo_more-minibatches_envs${envs} $EXTRA_FLAGS"
            echo "$PYTHON ppo_atari_envpool.py $common --num-minibatches 4 --lr-scaling sqrt --lr-reference-envs 8" \
                "--exp-name ppo_bigger-minibatches-sqrt-lr_envs${envs} $EXTRA_FLAGS"
        done
    done
done | bash sweeps/launch.sh
