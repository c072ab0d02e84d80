#!/usr/bin/env bash
# The outer loop's step size on Atari (Beukman et al. 2026, Fig. 4 and 6; kinetix.sh has both on Kinetix):
#   4  the learning rate cannot make up for a poor outer step: PPO-EWMA's LR (LRS) x centre of mass (LR_COMS) x LR
#      annealed to 0 or constant; the figure keeps the best run per LR and COM (aggregate.py --best learning_rate ewma_com)
#   6  epochs (EPOCH_LIST) x the regularisation, which sets the outer step: PPO-EWMA's centre of mass (EPOCH_COMS,
#      Fig. 6a) and standard PPO's clip epsilon (EPOCH_CLIPS, Fig. 6b, down to the figure's eps 0)
# Each configuration is one run directory named by every value it sets (e.g. ewma_com8_clip0.1_epochs4_lr2.5e-4_anneal);
# a run the two figures share (COM x Table 1's LR, annealed, 4 epochs) trains once. N_envs x N_RO is Table 1's 8 x 128.
#
#   bash sweeps/outer_step.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/outer_step.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/outer_step --best learning_rate ewma_com  # Fig. 4
#   .venv/bin/python sweeps/aggregate.py report runs/outer_step                        # Fig. 6
#
# FIGURES picks the figures (default "4 6"). CPU default: GAMES=Breakout SEEDS="1" TOTAL_TIMESTEPS=16384
#   LRS="2.5e-4 1e-3" LR_COMS="8" EPOCH_LIST="2 4" EPOCH_COMS="8" EPOCH_CLIPS="0.1" (7 runs).
# Paper (SCALE=paper): the Atari-10, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=100000000, and values of ours (the paper's
#   are Kinetix's, in its plots only), around Table 1's LR 2.5e-4, 4 epochs and clip 0.1: LRS="1e-4 2.5e-4 1e-3",
#   LR_COMS="1 8 64" (ewma_recipe.sh's), EPOCH_LIST="1 2 4 8 16", EPOCH_COMS="1 64", EPOCH_CLIPS="0 0.1 0.3"
#   (41 configurations x 50 = 2,050 runs of 100M steps). The clip of the PPO-EWMA runs is ppo_ewma_atari.py's 0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${GAMES:=$ATARI_10}" "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=100000000}" "${LRS:=1e-4 2.5e-4 1e-3}"
    : "${LR_COMS:=1 8 64}" "${EPOCH_LIST:=1 2 4 8 16}" "${EPOCH_COMS:=1 64}" "${EPOCH_CLIPS:=0 0.1 0.3}"
fi
: "${GAMES:=Breakout}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=16384}" "${LRS:=2.5e-4 1e-3}" "${LR_COMS:=8}"
: "${EPOCH_LIST:=2 4}" "${EPOCH_COMS:=8}" "${EPOCH_CLIPS:=0.1}" "${FIGURES:=4 6}"
: "${RUNS_DIR:=runs/outer_step}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
for figure in $FIGURES; do
    if [[ ! $figure =~ ^(4|6)$ ]]; then
        echo "error: FIGURES holds '$figure': give 4, 6 or both (Beukman et al.'s figures)" >&2
        exit 2
    fi
done

declare -A listed=() # the configurations printed so far, per game and seed: a run shared by two figures trains once
# One configuration: COM ("ppo": standard PPO), clip, epochs, LR, anneal (yes/no); $game and $seed are the loops'.
configuration() {
    local com=$1 clip=$2 epochs=$3 lr=$4 anneal=$5 name script=ppo_atari_envpool.py flags=""
    name="ppo"
    [[ $com != ppo ]] && name="ewma_com$com" script=ppo_ewma_atari.py flags="--ewma-com $com "
    name+="_clip${clip}_epochs${epochs}_lr${lr}_$([[ $anneal == yes ]] && echo anneal || echo constant)"
    flags+="--clip-coef $clip --update-epochs $epochs --learning-rate $lr --$([[ $anneal == yes ]] || echo no-)anneal-lr"
    [[ -n ${listed["$game $seed $name"]:-} ]] && return
    listed["$game $seed $name"]=1
    echo "$PYTHON $script --env-id $game-v5 --seed $seed $flags --total-timesteps $TOTAL_TIMESTEPS --exp-name $name" \
        "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
}

for game in $GAMES; do
    for seed in $SEEDS; do
        for figure in $FIGURES; do
            if [[ $figure == 4 ]]; then
                for com in $LR_COMS; do
                    for lr in $LRS; do
                        for anneal in yes no; do configuration "$com" 0.1 4 "$lr" "$anneal"; done
                    done
                done
            else
                for epochs in $EPOCH_LIST; do
                    for com in $EPOCH_COMS; do configuration "$com" 0.1 "$epochs" 2.5e-4 yes; done
                    for clip in $EPOCH_CLIPS; do configuration ppo "$clip" "$epochs" 2.5e-4 yes; done
                done
            fi
        done
    done
done | bash sweeps/launch.sh
