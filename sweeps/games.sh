# shellcheck shell=bash disable=SC2034 - the lists are for the sweeps that source this file
# The game lists of the sweeps' paper-scale defaults (SCALE=paper), in one place. Not a sweep:
# each sweep sources it (`source sweeps/games.sh` from the repository root) and sets GAMES from one.
# ATARI_10 and HARD_EXPLORATION are also metrics.py's score-table lists; tests/test_copies.py keeps them equal.
# It also checks what every sweep is given: settings come from environment variables (listed in each
# sweep's header), never from arguments, so that `bash sweeps/x.sh --help` cannot start a sweep.

if (($#)); then
    echo "error: $(basename "$0") takes no arguments (got '$1'): set its variables instead (its header lists them)," \
        "e.g. LAUNCHER=print bash $0 prints its commands" >&2
    exit 2
fi
if [[ ${SCALE:-cpu} != cpu && ${SCALE:-cpu} != paper ]]; then
    echo "error: SCALE must be cpu or paper, got '$SCALE'" >&2
    exit 2
fi

# Atari-10 (Aitchison et al. 2023): the Atari games of Mayor et al. 2025's main experiments
ATARI_10="Amidar Bowling Frostbite KungFuMaster Riverraid BattleZone DoubleDunk NameThisGame Phoenix Qbert"
# hard exploration (Mayor et al. 2025, Fig. 15, 16): PPO and PPO+RND
HARD_EXPLORATION="MontezumaRevenge Venture PrivateEye Gravitar Solaris Pitfall"
# Procgen, easy mode (Mayor et al. 2025, Fig. 8)
PROCGEN_GAMES="Bigfish Starpilot"
# the illustrative games of the state-space coverage figures (Mayor et al. 2025, Fig. 2, 9)
COVERAGE_GAMES="Breakout Pong Qbert Amidar"
# continuous control (Mayor et al. 2025, Fig. 7, 18), Isaac Gym's and MuJoCo Warp's names; EnvPool's add -v5
CONTINUOUS_TASKS="Ant Humanoid"
