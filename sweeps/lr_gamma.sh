#!/usr/bin/env bash
# Learning rate and discount (paper Fig. 11, 12): should the LR follow the batch when
# N_envs grows (x k or x sqrt(k), Hilton et al.'s two rules, and decreased by the same factor, / k or / sqrt(k), as
# Fig. 11 also does; k = N_envs / 8; N_RO = 128), and are the gains of a longer rollout (N_RO x 2:
# GAMMA_SHAPES="8x128 8x256") the same for every discount gamma?
#
#   bash sweeps/lr_gamma.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/lr_gamma.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/lr_gamma
#
# CPU default: GAMES=Breakout SEEDS="1 2" TOTAL_TIMESTEPS=16384 NUM_ENVS="8 32"
#   LR_SCALINGS="none sqrt linear inverse-sqrt inverse" GAMMAS="0.99 0.999" GAMMA_SHAPES="8x128 8x256".
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000,
#   NUM_ENVS="8 16 32 64 128", the same LR scalings, GAMMAS="0.95 0.99 0.995 0.999", the same GAMMA_SHAPES (Fig. 12's
#   caption calls gamma 0.95 the default, Table 1 0.99: both are in GAMMAS; the LR runs use Table 1's 0.99).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${NUM_ENVS:=8 16 32 64 128}"
    : "${GAMMAS:=0.95 0.99 0.995 0.999}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1 2}" "${TOTAL_TIMESTEPS:=16384}" "${NUM_ENVS:=8 32}"
: "${LR_SCALINGS:=none sqrt linear inverse-sqrt inverse}" "${GAMMAS:=0.99 0.999}" "${GAMMA_SHAPES:=8x128 8x256}"
: "${RUNS_DIR:=runs/lr_gamma}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

# Each training once: at N_envs 8 (k = 1) every scaling is the unscaled LR, so the baseline ppo_lr-none_envs8 stands for
# all five lines there, and for gamma 0.99 at 8 x 128 in the gamma comparison (when LR_SCALINGS and NUM_ENVS hold it).
baseline_in_sweep=$([[ " $LR_SCALINGS " == *" none "* && " $NUM_ENVS " == *" 8 "* ]] && echo yes || true)
for game in $GAMES; do
    for seed in $SEEDS; do
        for envs in $NUM_ENVS; do
            for scaling in $LR_SCALINGS; do # LR scaling at the default gamma
                [[ $envs == 8 && $scaling != none && $baseline_in_sweep ]] && continue
                echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps 128" \
                    "--lr-scaling $scaling --lr-reference-envs 8 --total-timesteps $TOTAL_TIMESTEPS" \
                    "--exp-name ppo_lr-${scaling}_envs${envs} --runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
        for shape in $GAMMA_SHAPES; do # gamma at the default LR (Fig. 12: the gain of N_RO x 2 for each gamma)
            envs=${shape%x*} steps=${shape#*x}
            for gamma in $GAMMAS; do
                [[ $shape == 8x128 && $gamma == 0.99 && $baseline_in_sweep ]] && continue
                echo "$PYTHON ppo_atari_envpool.py --env-id $game-v5 --seed $seed --num-envs $envs --num-steps $steps" \
                    "--gamma $gamma --total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_gamma${gamma}_envs${envs}_steps$steps" \
                    "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
