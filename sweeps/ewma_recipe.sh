#!/usr/bin/env bash
# PPO-EWMA, PPO's clip epsilon and the large-batch recipe (Beukman et al. 2026, Fig. 5, 7 at a fixed step budget, 8,
# 9, 13-14; not Fig. 6's epochs: outer_step.sh): as N_envs grows,
#  (a) PPO-EWMA's centre of mass x clip x batch (Fig. 5a, 7a), and standard PPO's clip epsilon x batch (PPO_CLIPS:
#      Fig. 5b, 7b; at PPO's default 0.1 the ppo_bigger-minibatches_envsN run below is that run, trained once), and
#  (b) how to spend a bigger batch with PPO: "more minibatches" (fixed minibatch size),
#      "bigger minibatches" (fixed number of minibatches), "bigger + sqrt LR" (Fig. 9; its SPS: Fig. 13-14).
# aggregate.py report plots final return against the data-to-divergence ratio (DDR), and the SPS of every configuration.
#
#   bash sweeps/ewma_recipe.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/ewma_recipe.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/ewma_recipe                   # Fig. 5 (at N_envs 8), 9, 13-14
#   .venv/bin/python sweeps/aggregate.py report runs/ewma_recipe --x updates       # Fig. 7: x = policy updates
#   .venv/bin/python sweeps/aggregate.py report runs/ewma_recipe --score max       # Fig. 8: DDR vs the maximum score
#   .venv/bin/python sweeps/aggregate.py report runs/ewma_recipe --heatmap ewma_com clip_coef   # Fig. 12b
#
# Fig. 7 compares N_envs at equal policy updates; here every run has the same step budget, so a larger N_envs makes
# fewer updates: --x updates draws them on one axis, the larger batches' curves ending first. Fig. 8 colours runs by
# budget: BUDGETS="25000000 100000000" adds the (a) runs at each budget other than TOTAL_TIMESTEPS (names end in
# _budget<budget>: a steps<N> part would be read as N_RO by aggregate.py's N_envs lines).
# CPU default: GAMES=Breakout SEEDS="1" TOTAL_TIMESTEPS=16384 NUM_ENVS="8 32" COMS="0 8"
#   CLIPS="0.1" PPO_CLIPS="0.1 0.2" BUDGETS=$TOTAL_TIMESTEPS.
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000,
#   NUM_ENVS="8 32 128", COMS="0 1 8 64", CLIPS="0.1 0.2", PPO_CLIPS="0.1 0.2 0.4" (ours: the paper's values are on
#   Kinetix and only in its plots; 0.4 the weak end), BUDGETS=$TOTAL_TIMESTEPS.
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}"
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${NUM_ENVS:=8 32 128}" "${COMS:=0 1 8 64}"
    : "${CLIPS:=0.1 0.2}" "${PPO_CLIPS:=0.1 0.2 0.4}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=16384}" "${NUM_ENVS:=8 32}" "${COMS:=0 8}" "${CLIPS:=0.1}"
: "${PPO_CLIPS:=0.1 0.2}" "${BUDGETS:=$TOTAL_TIMESTEPS}"
: "${RUNS_DIR:=runs/ewma_recipe}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"

for game in $GAMES; do
    for seed in $SEEDS; do
        for envs in $NUM_ENVS; do
            common="--env-id $game-v5 --seed $seed --num-envs $envs --num-steps 128"
            common="$common --runs-dir $RUNS_DIR --checkpoint-interval 20"
            for budget in $BUDGETS; do
                suffix=$([[ $budget == "$TOTAL_TIMESTEPS" ]] || echo "_budget$budget")
                for com in $COMS; do
                    for clip in $CLIPS; do
                        echo "$PYTHON ppo_ewma_atari.py $common --total-timesteps $budget --ewma-com $com --clip-coef $clip" \
                            "--exp-name ewma_com${com}_clip${clip}_envs${envs}$suffix $EXTRA_FLAGS"
                    done
                done
                for clip in $PPO_CLIPS; do # PPO's default 0.1 at TOTAL_TIMESTEPS: the ppo_bigger-minibatches run below
                    [[ -z $suffix && $(awk "BEGIN { print ($clip == 0.1) }") == 1 ]] && continue
                    echo "$PYTHON ppo_atari_envpool.py $common --total-timesteps $budget --clip-coef $clip" \
                        "--exp-name ppo_clip${clip}_envs${envs}$suffix $EXTRA_FLAGS"
                done
            done
            common="$common --total-timesteps $TOTAL_TIMESTEPS"
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
