#!/usr/bin/env bash
# Continuous control (paper Fig. 7, 18; the reviewers' request): N_envs vs N_RO for
# Gaussian PPO on three tasks, from (N_envs, N_RO) = (1024, 16), batch x k by more
# environments or longer rollouts. BACKEND=envpool (default) runs EnvPool's Ant-v5 and
# Humanoid-v5 on the CPU anywhere; BACKEND=mjwarp runs Gymnasium's Ant-v5 and Humanoid-v5 on
# MuJoCo Warp (a GPU simulator; on a CPU it is slow); BACKEND=isaacgym runs the Isaac Gym tasks.
# GAMES="Ant Humanoid" names the same two tasks on every backend. On a GPU use BACKEND=mjwarp (Ant at 4096 envs on an
# H200: 4.4x EnvPool's PPO SPS on 16 cores, benchmarks/RESULTS.md), with a RUNS_DIR per backend: their runs are of
# other tasks (Ant-v5 on EnvPool, Ant elsewhere) and one report would show them as two games.
#
#   bash sweeps/continuous.sh                                 # small CPU version
#   SCALE=paper LAUNCHER=print bash sweeps/continuous.sh      # the paper's commands
#   .venv/bin/python sweeps/aggregate.py report runs/continuous
#
# CPU default: GAMES=Ant-v5 SEEDS="1" TOTAL_TIMESTEPS=65536 BASE=64x16 MULTIPLIERS="1 2".
# Paper (SCALE=paper): GAMES=$CONTINUOUS_TASKS of sweeps/games.sh ("Ant Humanoid"; with -v5 on
#   envpool) and a third task, SEEDS="1 2 3 4 5", TOTAL_TIMESTEPS=30000000, BASE=1024x16, MULTIPLIERS="1 2 4 8": the
#   budget, base and grid are ours (the paper gives none). The paper's three Isaac Gym tasks are not named; Ant and
#   Humanoid are the spec's, the third is ours: Anymal on Isaac Gym (legged locomotion, as the other two; in CleanRL's
#   Isaac Gym benchmark, whose PPO the paper uses), Walker2d-v5 on EnvPool (no Anymal there: the closest MuJoCo task,
#   a walker that ends its episode when it falls, as Anymal does), none on MuJoCo Warp (its adapter has Ant and
#   Humanoid only: two tasks).
set -euo pipefail
cd "$(dirname "$0")/.."
source sweeps/games.sh
: "${BACKEND:=envpool}"
if [[ ! $BACKEND =~ ^(envpool|mjwarp|isaacgym)$ ]]; then # not auto: a re-run finds its runs by the task's name there
    echo "error: BACKEND must be envpool, mjwarp or isaacgym, got '$BACKEND'" >&2
    exit 2
fi
if [[ ${SCALE:-cpu} == paper ]]; then
    case $BACKEND in
    envpool) : "${GAMES:=${CONTINUOUS_TASKS// /-v5 }-v5 Walker2d-v5}" ;;
    isaacgym) : "${GAMES:=$CONTINUOUS_TASKS Anymal}" ;;
    mjwarp) : "${GAMES:=$CONTINUOUS_TASKS}" ;;
    esac
    : "${SEEDS:=1 2 3 4 5}" "${TOTAL_TIMESTEPS:=30000000}" "${BASE:=1024x16}" "${MULTIPLIERS:=1 2 4 8}"
fi
: "${GAMES:=Ant-v5}" "${SEEDS:=1}" "${TOTAL_TIMESTEPS:=65536}" "${BASE:=64x16}" "${MULTIPLIERS:=1 2}"
: "${RUNS_DIR:=runs/continuous}" "${PYTHON:=.venv/bin/python}" "${EXTRA_FLAGS:=}"
base_envs=${BASE%x*} base_steps=${BASE#*x}

for game in $GAMES; do
    # the name ppo_isaacgym.py gives the task (and its run directories, which launch.sh looks for to skip or resume a
    # run): Ant-v5 and Humanoid-v5 on EnvPool, Ant and Humanoid on Isaac Gym and MuJoCo Warp
    case $BACKEND:$game in
    envpool:Ant | envpool:Humanoid) game=$game-v5 ;;
    envpool:*) ;;
    *:Ant-v5 | *:Humanoid-v5) game=${game%-v5} ;;
    esac
    for seed in $SEEDS; do
        for k in $MULTIPLIERS; do
            shapes="$((base_envs * k))x$base_steps"
            ((k > 1)) && shapes="$shapes ${base_envs}x$((base_steps * k))"
            for shape in $shapes; do
                envs=${shape%x*} steps=${shape#*x}
                echo "$PYTHON ppo_isaacgym.py --backend $BACKEND --env-id $game --seed $seed --num-envs $envs" \
                    "--num-steps $steps --total-timesteps $TOTAL_TIMESTEPS --exp-name ppo_envs${envs}_steps${steps}" \
                    "--runs-dir $RUNS_DIR --checkpoint-interval 20 $EXTRA_FLAGS"
            done
        done
    done
done | bash sweeps/launch.sh
