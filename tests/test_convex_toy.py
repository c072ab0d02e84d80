"""sweeps/convex_toy.py: Beukman et al.'s noisy convex problem (SGD on x^T x): the plateaus of the step sizes, the
restart's move to its new step size's plateau, the figure, and bad flags."""

import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "sweeps"))
import convex_toy  # noqa: E402

TOY = os.path.join(ROOT, "sweeps", "convex_toy.py")


def test_a_larger_step_size_plateaus_farther_from_the_optimum_and_a_restart_moves_to_its_new_plateau(tmp_path):
    """Seeds 1-5, 1,000 steps: each converged step size ends at its stationary distance sqrt(dim s^2 lr / (4 (1 - lr)))
    (0.98, 0.50 and 0.15 for 0.3, 0.1, 0.01: larger farther); 0.001 contracts by (1 - 0.002) a step, so after 1,000 steps
    it is still about 10 e^-2 = 1.35 away (1.5 over the last 10 %): not converged. A restart at step 500 ends at the
    plateau of its new step size, whichever it came from."""
    out = tmp_path / "toy.png"
    results = convex_toy.main(["--steps", "1000", "--step-sizes", "0.3", "0.1", "0.01", "0.001", "--out", str(out)])
    plateaus = {lr: convex_toy.plateau(distances) for lr, (distances, _) in results["runs"].items()}
    assert plateaus[0.3] > plateaus[0.1] > plateaus[0.01]  # the ordering of Fig. 1b
    stationary = {0.3: 1.5 * math.sqrt(0.3 / 0.7), 0.1: 1.5 * math.sqrt(0.1 / 0.9), 0.01: 1.5 * math.sqrt(0.01 / 0.99)}
    for lr, distance in stationary.items():  # dim s^2 = 50 * 9 / 50 = 9: sqrt(9 lr / (4 (1 - lr))) = 1.5 sqrt(lr / (1 - lr))
        assert plateaus[lr] == pytest.approx(distance, rel=0.05), lr
    on_its_way = 10 * sum(0.998**step for step in range(901, 1001)) / 100  # the last 10 %: steps 901-1000
    assert plateaus[0.001] == pytest.approx(on_its_way, rel=0.05) and on_its_way > 9 * stationary[0.01]  # too small
    updates = {lr: updates[:, -100:].mean() for lr, (_, updates) in results["runs"].items()}
    assert updates[0.3] > updates[0.1] > updates[0.01] > updates[0.001]  # Fig. 2a: large steps keep moving
    restarted = {pair: convex_toy.plateau(distances) for pair, distances in results["restarts"].items()}
    assert sorted(restarted) == [(0.01, 0.3), (0.3, 0.01)]
    assert restarted[0.3, 0.01] == pytest.approx(stationary[0.01], rel=0.1)  # down to the small step's plateau
    assert restarted[0.01, 0.3] == pytest.approx(stationary[0.3], rel=0.1)  # up to the large step's
    assert out.stat().st_size > 20_000


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--step-sizes", "1.5"], "step size 1.5: give step sizes in (0, 1)"),
        (["--steps", "0"], "--steps must be > 0, got 0"),
        (["--restart-step", "10", "--steps", "10"], "--restart-step 10 must be inside the run"),
        (["--restart-step-sizes", "0.1"], "give at least two different step sizes"),
        (["--noise-std", "-1"], "--noise-std must be finite and >= 0, got -1.0"),
        (["--seeds", "x"], "argument --seeds: invalid int value: 'x'"),
        (["--out", "/no/such/folder/toy.png"], "its folder does not exist"),
    ],
)
def test_bad_flags_exit_2_in_one_line(arguments, message):
    result = subprocess.run([sys.executable, TOY, *arguments], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr
