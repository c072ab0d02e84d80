#!/usr/bin/env bash
# The large-batch recipe on continuous control (Beukman et al. 2026, Fig. 9, its SPS in Fig. 13-14; ewma_recipe.sh
# runs them on Atari, kinetix.sh on Kinetix): Gaussian PPO (ppo_isaacgym.py) from BASE N_envs x N_RO, N_envs x k
# (MULTIPLIERS) three ways: "more minibatches" (--minibatch-size of the base's: more optimizer steps of the same size),
# "bigger minibatches" (--num-minibatches of the base's, the same LR) and "bigger + sqrt LR" (--lr-scaling sqrt
# --lr-reference-envs <base N_envs>). At k = 1 the three are one run. BACKEND and GAMES as in continuous.sh.
#
#   bash sweeps/continuous_recipe.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/continuous_recipe.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/continuous_recipe            # Fig. 9 and the SPS figure (13-14)
#   .venv/bin/python sweeps/aggregate.py report runs/continuous_recipe --x time   # the same against wall-clock time
#
# CPU default: BACKEND=envpool GAMES=Ant-v5 SEEDS="1" TOTAL_TIMESTEPS=65536 BASE=64x16 NUM_MINIBATCHES=2
#   MULTIPLIERS="1 4" (4 runs).
# Paper (SCALE=paper): the tasks of continuous.sh's paper scale for BACKEND, SEEDS="1 2 3 4 5",
#   TOTAL_TIMESTEPS=30000000, BASE=1024x16 with NUM_MINIBATCHES=2 (ppo_isaacgym.py's: minibatches of 8,192),
#   MULTIPLIERS="1 4 16" (up to 16,384 envs; with more minibatches, 32 of 8,192 there). Beukman et al. run Fig. 9 on
#   Kinetix and the recipe on Isaac Gym's dexterous tasks with SAPG's code (Fig. 10: not here); the tasks, base and grid
#   here are ours. (3 tasks x 5 seeds x 7 = 105 runs on envpool or isaacgym, 70 on mjwarp.)
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
: "${BACKEND:=envpool}"
if [[ ! $BACKEND =~ ^(envpool|mjwarp|isaacgym)$ ]]; then # not auto: a re-run finds its runs by the task's name there
    echo "error: BACKEND must be envpool, mjwarp or isaacgym, got '$BACKEND'" >&2
    exit 2
fi
if [[ ${SCALE:-cpu} == paper ]]; then
    case $BACKEND in # continuous.sh's tasks
    envpool) : "${GAMES:=${CONTINUOUS_TASKS// /-v5 }-v5 Walker2d-v5}" ;;
    isaacgym) : "${GAMES:=$CONTINUOUS_TASKS Anymal}" ;;
    mjwarp) : "${GAMES:=$CONTINUOUS_TASKS}" ;;
    esac
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=30000000}" "${BASE:=1024x16}" "${MULTIPLIERS:=1 4 16}"
fi
: "${GAMES:=Ant-v5}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=65536}" "${BASE:=64x16}" "${MULTIPLIERS:=1 4}"
: "${NUM_MINIBATCHES:=2}" "${RUNS_DIR:=runs/continuous_recipe}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
base_envs=${BASE%x*} steps=${BASE#*x}
minibatch_size=$((base_envs * steps / NUM_MINIBATCHES))

for game in $GAMES; do
    case $BACKEND:$game in # the task's name in its run directories (continuous.sh)
    envpool:Ant | envpool:Humanoid) game=$game-v5 ;;
    envpool:*) ;;
    *:Ant-v5 | *:Humanoid-v5) game=${game%-v5} ;;
    esac
    for seed in $SEEDS; do
        for k in $MULTIPLIERS; do
            envs=$((base_envs * k))
            common="$PYTHON ppo_isaacgym.py --backend $BACKEND --env-id $game --seed $seed --num-envs $envs"
            common="$common --num-steps $steps --total-timesteps $TOTAL_TIMESTEPS"
            # "flags name": at k = 1 the first stands for all three
            splits=("--num-minibatches $NUM_MINIBATCHES bigger-minibatches")
            sqrt_lr="--num-minibatches $NUM_MINIBATCHES --lr-scaling sqrt --lr-reference-envs $base_envs"
            ((k > 1)) && splits+=("--minibatch-size $minibatch_size more-minibatches" "$sqrt_lr bigger-minibatches-sqrt-lr")
            for split in "${splits[@]}"; do
                echo "$common ${split% *} --exp-name ppo_${split##* }_envs$envs --runs-dir $RUNS_DIR" \
                    "--checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
