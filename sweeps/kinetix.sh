#!/usr/bin/env bash
# Beukman et al. 2026 in their own domain: PPO and PPO-EWMA (ppo_kinetix.py) on Kinetix / Jax2D, scored by the solve
# rate (charts/solve_rate: the fraction of the --num-tasks training tasks solved). FIGURES picks the figures:
#   1a  PPO-EWMA's centre of mass (COMS); the same runs are Fig. 5a
#   4   learning rate x centre of mass x LR annealing (LRS x LR_COMS x anneal or not; the figure: the best per LR)
#   5   clip epsilon (CLIPS), standard PPO and PPO-EWMA at each of CLIP_COMS (Fig. 5b; CLIP_COMS="8 32 128 512" gives
#       Appendix Fig. 12's grid of COM x eps)
#   6   epochs (EPOCH_LIST) x PPO-EWMA's COM (EPOCH_COMS, Fig. 6a) and x PPO's clip epsilon (EPOCH_CLIPS, Fig. 6b)
#   7   N_envs (REG_ENVS) with a fixed number of minibatches (the minibatch grows with the batch) x COM (REG_COMS) and
#       x clip (REG_CLIPS), compared at equal policy updates: each N_envs trains the iterations that BASE_ENVS makes in
#       TOTAL_TIMESTEPS (the names end in _sameupdates; aggregate.py report --x updates plots them against updates)
#   8   DDR against the best solve rate per budget: the regularisations of Figs. 1a and 5 (COMS, and PPO at CLIPS) at
#       each of BUDGETS (names end in _budget<N> but at TOTAL_TIMESTEPS; aggregate.py report --score max draws it with
#       every run of the folder, a point per run coloured by its budget: Figs. 4, 6, 7, 9's too, since the DDR joins
#       batch and divergence, Sec. 4.4; FIGURES=8 with a RUNS_DIR of its own for Fig. 8's runs alone)
#   9   N_envs (RECIPE_ENVS) three ways, PPO: a fixed minibatch size (more minibatches: _mbsize<N>), a fixed number of
#       minibatches (bigger ones, the same LR) and bigger minibatches with the LR scaled from BASE_ENVS (LR_SCALINGS)
# Each configuration is one run directory whose name is the configuration (e.g. ewma_com8_clip0.2_epochs8_lr3e-4_envs64);
# a run that several figures share (the base point of each) trains once. Every command gives the swept flags
# explicitly; the rest are ppo_kinetix.py's defaults.
#
#   bash sweeps/kinetix.sh                                  # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/kinetix.sh       # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/kinetix              # --x updates: Fig. 7; --score max: Fig. 8
#
# TASK_SETS (locomotion, random, handmade; default locomotion) and ENV_SIZES (s, m, l; locomotion: m or l) stand for
# GAMES: each pair is a task (env_id Kinetix-<set>-<size>); SEEDS, TOTAL_TIMESTEPS, JOBS, SCALE and LAUNCHER as in every
# sweep. The runs checkpoint every 20 iterations, as every sweep's.
# CPU default (on 2 cores): TASK_SETS=locomotion ENV_SIZES=m (locomotion has no s) NUM_TASKS=16 SEEDS="1"
#   TOTAL_TIMESTEPS=204800 BASE_ENVS=64 NUM_STEPS=32 (100 iterations of 2,048 steps), EPOCHS=8 NUM_MINIBATCHES=32 LR=3e-4
#   CLIP=0.2 ANNEAL_LR=no, COMS="8 128" LR_COMS=8 LRS="3e-4 1e-3" CLIPS="0.2 0.6" CLIP_COMS=128 EPOCH_LIST="2 8"
#   EPOCH_COMS=8 EPOCH_CLIPS=0.2 REG_ENVS="16 64" REG_COMS=8 REG_CLIPS=0.6 RECIPE_ENVS="16 256" LR_SCALINGS=sqrt
#   BUDGETS="51200 204800" EVAL_INTERVAL=10: 22 runs of up to about 5 minutes each (about 1,000 steps/s on one core,
#   after JAX's first compilation, about a minute).
# Paper (SCALE=paper), from Table 2 and Appendix A: NUM_TASKS=512 morphologies, SEEDS="1 2 3 4 5", BASE_ENVS=2048,
#   NUM_STEPS=256, EPOCHS=8, NUM_MINIBATCHES=32 (minibatches of 16,384), LR=3e-4, CLIP=0.2. The swept values are ours
#   where the text gives none (the figures' values are only in their plots): COMS="8 32 128 512" (the text names COM 8
#   as too weak, Sec. 3.2, 4.3), LR_COMS="8 128", LRS="1e-4 3e-4 1e-3", CLIPS="0.05 0.1 0.2 0.4 0.6" (0.6 weak: Sec.
#   4.3), CLIP_COMS=128, EPOCH_LIST="1 2 4 8 16", EPOCH_COMS="8 128", EPOCH_CLIPS="0 0.2 0.6" (eps 0 as in Fig. 6b,
#   Sec. 4.2), REG_ENVS="16 512 2048 8192" (Sec. 4.3's "small batch size (e.g., 4096)" is a minibatch by its footnote,
#   "these minibatches", so 512 envs; 16 envs, a rollout of 4,096, covers the other reading), REG_COMS="8 128",
#   REG_CLIPS="0.2 0.6", RECIPE_ENVS="256 1024 8192", LR_SCALINGS=sqrt (the square-root rule, Sec. 5),
#   BUDGETS="268435456 1073741824 4294967296" (2^28, 2^30, 2^32: Fig. 8's budgets are only in its plot), ENV_SIZES=l
#   (the morphologies' size is not given: ppo_kinetix.py's default), EVAL_INTERVAL=50 (the solve rate every 50
#   iterations, as Kinetix's own evaluation, configs/eval/{s,m,l}.yaml: an evaluation plays the 512 tasks in batches
#   of N_envs, 32 batches of 256 steps at 16 envs; its 20 attempts a task: EXTRA_FLAGS="--eval-attempts 20").
#   TOTAL_TIMESTEPS=1073741824 (2^30: 2,048 iterations of the base batch) is Kinetix's PPO budget (Matthews et al.
#   2025, configs/learning/ppo-base.yaml); neither the text nor Table 2 gives one. ANNEAL_LR=no outside Fig. 4 is that
#   file's anneal_lr, but the paper ran Stoix's PPO (App. A), whose default configuration decays the LR linearly
#   (ff_ppo.yaml): ANNEAL_LR=yes for that reading. (83 configurations x 5 seeds = 415 runs.)
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
if [[ ${SCALE:-cpu} == paper ]]; then
    : "${NUM_TASKS:=512}" "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=1073741824}" "${BASE_ENVS:=2048}" "${NUM_STEPS:=256}"
    : "${COMS:=8 32 128 512}" "${LR_COMS:=8 128}" "${LRS:=1e-4 3e-4 1e-3}" "${CLIPS:=0.05 0.1 0.2 0.4 0.6}"
    : "${ENV_SIZES:=l}" "${EPOCH_LIST:=1 2 4 8 16}" "${EPOCH_COMS:=8 128}" "${EPOCH_CLIPS:=0 0.2 0.6}"
    : "${REG_ENVS:=16 512 2048 8192}" "${REG_COMS:=8 128}" "${REG_CLIPS:=0.2 0.6}" "${RECIPE_ENVS:=256 1024 8192}"
    : "${BUDGETS:=268435456 1073741824 4294967296}" "${EVAL_INTERVAL:=50}"
fi
: "${TASK_SETS:=locomotion}" "${ENV_SIZES:=m}" "${NUM_TASKS:=16}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=204800}"
: "${BASE_ENVS:=64}" "${NUM_STEPS:=32}" "${EPOCHS:=8}" "${NUM_MINIBATCHES:=32}" "${LR:=3e-4}" "${CLIP:=0.2}"
: "${ANNEAL_LR:=no}" "${COMS:=8 128}" "${LR_COMS:=8}" "${LRS:=3e-4 1e-3}" "${CLIPS:=0.2 0.6}" "${CLIP_COMS:=128}"
: "${EPOCH_LIST:=2 8}" "${EPOCH_COMS:=8}" "${EPOCH_CLIPS:=0.2}" "${REG_ENVS:=16 64}" "${REG_COMS:=8}" "${REG_CLIPS:=0.6}"
: "${RECIPE_ENVS:=16 256}" "${LR_SCALINGS:=sqrt}" "${FIGURES:=1a 4 5 6 7 8 9}"
: "${BUDGETS:=51200 $TOTAL_TIMESTEPS}" "${EVAL_INTERVAL:=10}"
: "${RUNS_DIR:=runs/kinetix}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
for figure in $FIGURES; do
    if [[ ! $figure =~ ^(1a|4|5|6|7|8|9)$ ]]; then
        echo "error: FIGURES holds '$figure': give some of 1a 4 5 6 7 8 9 (Beukman et al.'s figures)" >&2
        exit 2
    fi
done
MINIBATCH_SIZE=$((BASE_ENVS * NUM_STEPS / NUM_MINIBATCHES)) # the base point's, kept by Fig. 9's "more minibatches"

declare -A listed=() # the configurations printed so far, per task and seed: a run shared by two figures trains once
# One configuration: COM ("ppo": standard PPO), clip, epochs, LR, anneal (yes/no), N_envs, how the batch is split
# ("count": NUM_MINIBATCHES; "size": minibatches of MINIBATCH_SIZE; an --lr-scaling: NUM_MINIBATCHES and the LR scaled
# from BASE_ENVS) and the budget (another than TOTAL_TIMESTEPS: Fig. 7's same updates at another N_envs, or Fig. 8's
# budgets at BASE_ENVS). Its name is the configuration; $task and $seed are the loops'.
configuration() {
    local com=$1 clip=$2 epochs=$3 lr=$4 anneal=$5 envs=$6 split=$7 budget=$8 name flags
    ((envs == BASE_ENVS)) && split=count # at the base N_envs the three splits are one training
    if [[ $com == ppo ]]; then
        name=ppo flags=""
    else
        name="ewma_com$com" flags="--ewma-com $com "
    fi
    name+="_clip${clip}_epochs${epochs}_lr$lr"
    flags+="--clip-coef $clip --update-epochs $epochs --learning-rate $lr"
    if [[ $anneal == yes ]]; then
        name+="_anneal" flags+=" --anneal-lr"
    else
        flags+=" --no-anneal-lr"
    fi
    name+="_envs$envs" flags+=" --num-envs $envs --num-steps $NUM_STEPS"
    case $split in
    count) flags+=" --num-minibatches $NUM_MINIBATCHES" ;;
    size) name+="_mbsize$MINIBATCH_SIZE" flags+=" --minibatch-size $MINIBATCH_SIZE" ;;
    *) name+="_lr-$split" flags+=" --num-minibatches $NUM_MINIBATCHES --lr-scaling $split --lr-reference-envs $BASE_ENVS" ;;
    esac
    if ((budget != TOTAL_TIMESTEPS && envs != BASE_ENVS)); then
        name+="_sameupdates"
    elif ((budget != TOTAL_TIMESTEPS)); then
        name+="_budget$budget"
    fi
    [[ -n ${listed["$task $seed $name"]:-} ]] && return
    listed["$task $seed $name"]=1
    echo "$PYTHON ppo_kinetix.py $task --seed $seed $flags --total-timesteps $budget --exp-name $name" \
        "--eval-interval $EVAL_INTERVAL --runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
}

# PPO-EWMA at each centre of mass of $1 (clip CLIP), then standard PPO at each clip of $2; epochs, N_envs and budget
# given, the LR and its annealing the base's, NUM_MINIBATCHES (Figs. 6, 7, 8).
regularisations() {
    local coms=$1 clips=$2 epochs=$3 envs=$4 budget=$5 com clip
    for com in $coms; do
        configuration "$com" "$CLIP" "$epochs" "$LR" "$ANNEAL_LR" "$envs" count "$budget"
    done
    for clip in $clips; do
        configuration ppo "$clip" "$epochs" "$LR" "$ANNEAL_LR" "$envs" count "$budget"
    done
}

for task_set in $TASK_SETS; do
    for size in $ENV_SIZES; do
        task="--task-set $task_set --env-size $size --num-tasks $NUM_TASKS"
        for seed in $SEEDS; do
            for figure in $FIGURES; do
                case $figure in
                1a)
                    for com in $COMS; do
                        configuration "$com" "$CLIP" "$EPOCHS" "$LR" "$ANNEAL_LR" "$BASE_ENVS" count "$TOTAL_TIMESTEPS"
                    done
                    ;;
                4)
                    for com in $LR_COMS; do
                        for lr in $LRS; do
                            for anneal in no yes; do
                                configuration "$com" "$CLIP" "$EPOCHS" "$lr" "$anneal" "$BASE_ENVS" count "$TOTAL_TIMESTEPS"
                            done
                        done
                    done
                    ;;
                5)
                    for clip in $CLIPS; do
                        for com in ppo $CLIP_COMS; do
                            configuration "$com" "$clip" "$EPOCHS" "$LR" "$ANNEAL_LR" "$BASE_ENVS" count "$TOTAL_TIMESTEPS"
                        done
                    done
                    ;;
                6)
                    for epochs in $EPOCH_LIST; do
                        regularisations "$EPOCH_COMS" "$EPOCH_CLIPS" "$epochs" "$BASE_ENVS" "$TOTAL_TIMESTEPS"
                    done
                    ;;
                7)
                    for envs in $REG_ENVS; do # the base's iterations: TOTAL_TIMESTEPS / (BASE_ENVS x NUM_STEPS)
                        budget=$TOTAL_TIMESTEPS
                        ((envs == BASE_ENVS)) || budget=$((TOTAL_TIMESTEPS / (BASE_ENVS * NUM_STEPS) * envs * NUM_STEPS))
                        regularisations "$REG_COMS" "$REG_CLIPS" "$EPOCHS" "$envs" "$budget"
                    done
                    ;;
                8)
                    for budget in $BUDGETS; do
                        regularisations "$COMS" "$CLIPS" "$EPOCHS" "$BASE_ENVS" "$budget"
                    done
                    ;;
                9)
                    for envs in $BASE_ENVS $RECIPE_ENVS; do
                        for split in size count $LR_SCALINGS; do
                            configuration ppo "$CLIP" "$EPOCHS" "$LR" "$ANNEAL_LR" "$envs" "$split" "$TOTAL_TIMESTEPS"
                        done
                    done
                    ;;
                esac
            done
        done
    done
done | bash sweeps/launch.sh
