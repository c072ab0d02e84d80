#!/usr/bin/env bash
# Issue #56's GPU checks on a CUDA machine that has no network and its own Python (this workplace's lent GPU machines:
# Python 3.12 with torch and JAX's CUDA build installed, JAX 0.11.2 there; no `make setup`). What ppo_kinetix.py needs
# beyond that image travels as wheels in .whl/ (git ignores it; about 2 MB, under the 64 MiB a call may carry):
#   here:  bash .ci/gpu_kinetix.sh wheels    # download them (for the Python given by WHEELS_PYTHON, default 3.12)
#   there: bash .ci/gpu_kinetix.sh [STAGE...] # carry .whl; logs and tables in $OUT (default /tmp/gpu_kinetix)
# There: the wheels installed beside the image's packages (--target, first on PYTHONPATH), Kinetix's CUDA tests, then
# benchmarks/sps.py's Kinetix table on the GPU at 2,048 and 65,536 envs x 256 steps and at 1,048,576 x 16 steps (256
# steps of 1M envs would need 150 GB for the observations alone). kinetix.util.saving imports wandb, which the image
# lacks and the environment never calls: tests/fake_wandb stands in. STAGEs (default: all, in this order, their time
# limits summing to 575 s, under a call's 600): versions tests sps_2048 sps_65536 sps_1m. The script goes on after a
# stage fails and exits 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=(kinetix-env jax2d jaxgl gymnax flax tyro docstring-parser typeguard gymnasium farama-notifications)

pin() { # "name==version" from the project's pins
    grep -ihE "^${1//-/[-_]}==" requirements.txt requirements-nodeps.txt constraints.txt | head -n 1
}

if [[ ${1:-} == wheels ]]; then
    rm -rf .whl && mkdir .whl
    pins=()
    for name in "${WHEELS[@]}"; do pins+=("$(pin "$name")"); done
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${WHEELS_PYTHON:-3.12}" \
        --dest .whl "${pins[@]}" || exit 1
    du -sh .whl
    exit 0
fi

OUT=${OUT:-/tmp/gpu_kinetix}
SITE=${SITE:-/tmp/gpu_kinetix_site}
mkdir -p "$OUT"
failed=0
stage() { # name, time limit in seconds, command...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T), limit ${limit}s): $*"
    timeout "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1
    local status=$?
    echo "== $name: exit $status"
    ((status == 0)) || failed=1
}

python3 -m pip install --quiet --no-deps --no-index --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH=$SITE:$PWD/tests/fake_wandb
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/gpu_kinetix_jax}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# benchmarks/sps.py's Kinetix table, one size a run (a time-out loses that row only)
SPS=(python3 benchmarks/sps.py --scripts --kinetix --cuda --steady --kinetix-iterations 3 --kinetix-envs)
stages=("$@")
((${#stages[@]})) || stages=(versions tests sps_2048 sps_65536 sps_1m)
for name in "${stages[@]}"; do
    case $name in
    versions) stage versions 45 python3 -c 'import jax, torch, kinetix, jax2d, flax
print("jax", jax.__version__, jax.devices(), "torch", torch.__version__, torch.cuda.get_device_name(), "flax", flax.__version__)' ;;
    tests) stage tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_ppo_kinetix.py -k "gpu or jax_without" ;;
    sps_2048) stage sps_2048 120 "${SPS[@]}" 2048 --num-steps 256 ;;
    sps_65536) stage sps_65536 130 "${SPS[@]}" 65536 --num-steps 256 ;;
    sps_1m) stage sps_1m 130 "${SPS[@]}" 1048576 --num-steps 16 ;;
    *) echo "unknown stage $name (versions tests sps_2048 sps_65536 sps_1m)" && exit 2 ;;
    esac
done
exit $failed
