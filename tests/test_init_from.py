"""--init-from (a new run from a checkpoint's weights, the follow-up's Fig. 3a) and --lr-scaling inverse-sqrt.

A checkpoint of each tested script is made once per module by a tiny in-process run; the new runs read their initial
state through a spy on `initialise_from` (called before the run is opened). ppo_atari_envpool.py, ppo_ewma_atari.py,
ppo_isaacgym.py (EnvPool MuJoCo on the CPU, with normalisers) and pqn_atari.py (a Q-network) are run end to end; the
other scripts share the same copied plumbing and are checked to refuse a missing file before anything is made."""

import copy
import importlib
import json
import math
import os
import shutil
import typing
from types import SimpleNamespace

import pytest
import torch
import tyro
from conftest import TINY_PPO_FLAGS, only_run_dir, read_scalars, run_main, usage_error

import ppo_atari_envpool
import ppo_ewma_atari
import ppo_isaacgym
import pqn_atari

# Two iterations of 2 envs x 16 steps: the new runs count from step 0 to 64
ATARI = [*TINY_PPO_FLAGS, "--total-timesteps", "64", "--update-epochs", "1"]
# One iteration of 4 envs x 16 steps of Ant (EnvPool MuJoCo), 2 minibatches
CONTINUOUS = "--no-cuda --backend envpool --env-id Ant --num-envs 4 --num-steps 16 --total-timesteps 64".split()
CONTINUOUS += "--max-episode-steps 20 --metrics-interval 1 --metrics-batch 32".split()


def make_checkpoint(module, flags, runs_dir) -> str:
    """A finished tiny run of `module`; the path of its checkpoint.pt."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_main(monkeypatch, module, [*flags, "--runs-dir", str(runs_dir)])
    return os.path.join(only_run_dir(runs_dir), "checkpoint.pt")


@pytest.fixture(scope="module")
def atari_checkpoint(tmp_path_factory):
    return make_checkpoint(ppo_atari_envpool, ATARI, tmp_path_factory.mktemp("atari"))


@pytest.fixture(scope="module")
def ewma_checkpoint(tmp_path_factory):
    return make_checkpoint(ppo_ewma_atari, [*ATARI, "--ewma-com", "4"], tmp_path_factory.mktemp("ewma"))


@pytest.fixture(scope="module")
def continuous_checkpoint(tmp_path_factory):
    return make_checkpoint(ppo_isaacgym, CONTINUOUS, tmp_path_factory.mktemp("continuous"))


def run_from(monkeypatch, module, flags, runs_dir) -> tuple[dict, str]:
    """Run `module` with `flags`; the state dicts of what `initialise_from` was given (copied as it returned, before
    the first update) and the new run's directory."""
    initial, original = {}, module.initialise_from

    def spy(args, *opened_run, **modules):
        original(args, *opened_run, **modules)
        initial.update({name: copy.deepcopy(module.state_dict()) for name, module in modules.items()})

    monkeypatch.setattr(module, "initialise_from", spy)
    run_main(monkeypatch, module, [*flags, "--runs-dir", str(runs_dir)])
    return initial, only_run_dir(runs_dir)


def assert_same_tensors(state: dict, expected: dict) -> None:
    assert state.keys() == expected.keys()
    for key, value in state.items():
        assert torch.equal(value.cpu(), expected[key]), key


def test_a_new_run_starts_from_the_checkpoints_weights_with_its_own_flags(monkeypatch, tmp_path, atari_checkpoint):
    saved = torch.load(atari_checkpoint, weights_only=True)
    flags = [*ATARI, "--seed", "7", "--clip-coef", "0.2", "--learning-rate", "1e-3", "--init-from", atari_checkpoint]
    initial, run_dir = run_from(monkeypatch, ppo_atari_envpool, flags, tmp_path)
    assert_same_tensors(initial["model"], saved["model"])  # the trained weights, not seed 7's initial ones
    assert initial["optimizer"]["state"] == {}  # a fresh Adam without --init-optimizer
    recorded = json.load(open(os.path.join(run_dir, "args.json")))
    assert (recorded["init_from"], recorded["init_optimizer"]) == (atari_checkpoint, False)
    assert (recorded["clip_coef"], recorded["learning_rate"], recorded["seed"]) == (0.2, 1e-3, 7)
    assert os.path.dirname(atari_checkpoint) != run_dir  # a run of its own
    # Its own step count from 0: two iterations logged at 32 and 64, the LR annealed from this run's 1e-3 over them
    scalars = read_scalars(run_dir)
    assert [step for step, _ in scalars["charts/learning_rate"]] == [32, 64]
    assert scalars["charts/learning_rate"][0][1] == pytest.approx(1e-3)
    assert scalars["charts/clip_coef"][0][1] == pytest.approx(0.2)
    final = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert (final["iteration"], final["global_step"]) == (2, 64)
    assert final["args"]["init_from"] == atari_checkpoint


def test_init_optimizer_loads_the_optimizer_state_with_this_runs_settings(monkeypatch, tmp_path, atari_checkpoint):
    saved = torch.load(atari_checkpoint, weights_only=True)
    flags = [*ATARI, "--adam-eps", "1e-4", "--init-from", atari_checkpoint, "--init-optimizer"]
    initial, _ = run_from(monkeypatch, ppo_atari_envpool, flags, tmp_path)
    state, expected = initial["optimizer"]["state"], saved["optimizer"]["state"]
    assert state.keys() == expected.keys() and len(state) == len(list(ppo_atari_envpool.Agent(4, False).parameters()))
    for index, moments in state.items():
        assert_same_tensors(moments, expected[index])  # step, exp_avg, exp_avg_sq of every parameter
    assert saved["optimizer"]["param_groups"][0]["eps"] == 1e-5
    assert initial["optimizer"]["param_groups"][0]["eps"] == 1e-4  # this run's flag, not the checkpoint's


@pytest.mark.parametrize(
    ("flags", "tensor"),
    [
        (["--separate-networks"], "model.critic_encoder.0.weight is absent there, (32, 4, 8, 8) here"),
        (["--env-id", "Pong-v5"], "model.actor.weight is (4, 512) there, (6, 512) here"),  # 6 actions, not Breakout's 4
    ],
)
def test_a_checkpoint_that_does_not_fit_the_flags_is_refused_before_the_run_exists(
    monkeypatch, capsys, tmp_path, atari_checkpoint, flags, tensor
):
    argv = ["ppo_atari_envpool.py", *ATARI, *flags, "--init-from", atari_checkpoint, "--runs-dir", str(tmp_path / "runs")]
    line = usage_error(ppo_atari_envpool.main, monkeypatch, capsys, argv)
    assert line == f"error: --init-from {atari_checkpoint!r} does not fit these flags: {tensor}"
    assert not os.path.exists(tmp_path / "runs")  # no half-made run


def test_init_from_and_resume_together_are_refused(monkeypatch, capsys, tmp_path, atari_checkpoint):
    argv = ["ppo_atari_envpool.py", *ATARI, "--init-from", atari_checkpoint, "--resume", atari_checkpoint]
    line = usage_error(ppo_atari_envpool.main, monkeypatch, capsys, [*argv, "--runs-dir", str(tmp_path)])
    assert line.startswith("error: --resume continues a run with its flags, --init-from starts a new one")
    argv = ["ppo_atari_envpool.py", *ATARI, "--init-optimizer", "--runs-dir", str(tmp_path)]
    assert usage_error(ppo_atari_envpool.main, monkeypatch, capsys, argv) == "error: --init-optimizer needs --init-from"
    assert not os.listdir(tmp_path)


def test_another_scripts_checkpoint_is_refused(monkeypatch, capsys, tmp_path, ewma_checkpoint):
    argv = ["ppo_atari_envpool.py", *ATARI, "--init-from", ewma_checkpoint, "--runs-dir", str(tmp_path / "runs")]
    line = usage_error(ppo_atari_envpool.main, monkeypatch, capsys, argv)
    assert line == f"error: --init-from {ewma_checkpoint!r} is not a checkpoint.pt of ppo_atari_envpool.py"
    assert not os.path.exists(tmp_path / "runs")


def test_ewma_restart_with_another_centre_of_mass_starts_the_proximal_policy_at_the_loaded_one(
    monkeypatch, tmp_path, ewma_checkpoint
):
    """The follow-up's Fig. 3a: trained with --ewma-com 4, restarted with 64. The proximal policy is not loaded: it
    starts equal to the loaded policy (W = 1), as a new run's starts at its initial weights."""
    saved = torch.load(ewma_checkpoint, weights_only=True)
    assert not all(torch.equal(saved["model"][key], saved["proximal"][key]) for key in saved["model"])  # they differ
    first = []  # the proximal policy and the weight sum W at the first EWMA update (after the first optimizer step)
    real_update = ppo_ewma_atari.ewma_update

    def spy(proximal, current, weight_sum, beta):
        if not first:
            first.append((copy.deepcopy(proximal.state_dict()), weight_sum))
        return real_update(proximal, current, weight_sum, beta)

    monkeypatch.setattr(ppo_ewma_atari, "ewma_update", spy)
    flags = [*ATARI, "--ewma-com", "64", "--init-from", ewma_checkpoint, "--init-optimizer"]
    initial, run_dir = run_from(monkeypatch, ppo_ewma_atari, flags, tmp_path)
    assert initial.keys() == {"model", "optimizer"}  # what initialise_from is given: the proximal policy is not loaded
    assert_same_tensors(initial["model"], saved["model"])
    assert_same_tensors(first[0][0], saved["model"])  # the loaded policy, not the checkpoint's proximal one
    assert first[0][1] == 1.0  # W starts at 1, not at the checkpoint's ewma_weight_sum
    assert json.load(open(os.path.join(run_dir, "args.json")))["ewma_com"] == 64


def test_continuous_init_from_loads_the_normalisers_only_with_init_optimizer(monkeypatch, tmp_path, continuous_checkpoint):
    saved = torch.load(continuous_checkpoint, weights_only=True)
    initial, _ = run_from(monkeypatch, ppo_isaacgym, [*CONTINUOUS, "--init-from", continuous_checkpoint], tmp_path / "a")
    assert_same_tensors(initial["model"], saved["model"])
    assert initial["obs_rms"]["count"].item() != saved["obs_rms"]["count"].item()  # its own, from the prior
    flags = [*CONTINUOUS, "--init-from", continuous_checkpoint, "--init-optimizer"]
    initial, _ = run_from(monkeypatch, ppo_isaacgym, flags, tmp_path / "b")
    for name in ("model", "obs_rms", "return_rms"):
        assert_same_tensors(initial[name], saved[name])
    assert initial["optimizer"]["state"].keys() == saved["optimizer"]["state"].keys()


def test_continuous_misfit_names_the_tensor(monkeypatch, capsys, tmp_path, continuous_checkpoint):
    """Checked once the envs give the shapes, made after the run was opened (its refusals come first): the new run's
    directory is removed."""
    argv = ["ppo_isaacgym.py", *CONTINUOUS, "--no-separate-networks", "--init-from", continuous_checkpoint]
    monkeypatch.setattr("sys.argv", [*argv, "--runs-dir", str(tmp_path / "runs")])
    with pytest.raises(SystemExit) as exit_info:
        ppo_isaacgym.main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"error: --init-from {continuous_checkpoint!r} does not fit these flags: model.")
    assert line.endswith(" here") and " there, " in line
    assert os.listdir(tmp_path / "runs") == []  # the run directory was made and removed; the folder of runs stays


def test_pqn_init_from_loads_the_q_network_and_refuses_another_action_count(monkeypatch, capsys, tmp_path):
    checkpoint = make_checkpoint(pqn_atari, ATARI, tmp_path / "first")
    saved = torch.load(checkpoint, weights_only=True)
    flags = [*ATARI, "--optimizer", "radam", "--init-from", checkpoint]  # another optimizer: only the weights are loaded
    initial, run_dir = run_from(monkeypatch, pqn_atari, flags, tmp_path / "second")
    assert_same_tensors(initial["model"], saved["model"])
    assert json.load(open(os.path.join(run_dir, "args.json")))["optimizer"] == "radam"
    argv = ["pqn_atari.py", *ATARI, "--env-id", "Pong-v5", "--init-from", checkpoint, "--runs-dir", str(tmp_path / "third")]
    capsys.readouterr()  # the two runs' lines
    line = usage_error(pqn_atari.main, monkeypatch, capsys, argv)
    assert line.startswith(f"error: --init-from {checkpoint!r} does not fit these flags: model.") and "(6, " in line
    assert not os.path.exists(tmp_path / "third")


SCRIPTS = ["ppo_atari_envpool", "ppo_ewma_atari", "ppo_rnd_atari", "pqn_atari", "ppo_procgen", "ppo_isaacgym", "ppo_kinetix"]


def import_script(name):
    if name == "ppo_kinetix":
        pytest.importorskip("kinetix", reason="needs Kinetix (make setup: requirements-nodeps.txt)")
    return importlib.import_module(name)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_refuses_a_missing_init_from_file_before_anything_is_made(name, monkeypatch, capsys, tmp_path):
    module = import_script(name)
    monkeypatch.setattr(module, "start_run", lambda *_: pytest.fail("the run was opened"))
    argv = [f"{name}.py", "--init-from", str(tmp_path / "no.pt"), "--runs-dir", str(tmp_path / "runs")]
    line = usage_error(module.main, monkeypatch, capsys, argv)
    assert line == f"error: --init-from {str(tmp_path / 'no.pt')!r}: no such checkpoint file"
    assert not os.path.exists(tmp_path / "runs")


def test_an_old_checkpoint_with_dormant_tau_resumes_as_sokars_test_with_that_tau(monkeypatch, tmp_path, atari_checkpoint):
    """Written before --dormant-definition: its --dormant-tau maps to --dormant-definition sokar with that threshold."""
    checkpoint = torch.load(atari_checkpoint, weights_only=True)
    for name in ("dormant_definition", "dormant_threshold", "init_from", "init_optimizer"):
        del checkpoint["args"][name]
    checkpoint["args"]["dormant_tau"] = 0.1
    os.makedirs(tmp_path / "run")
    torch.save(checkpoint, tmp_path / "run" / "checkpoint.pt")
    shutil.copy(os.path.join(os.path.dirname(atari_checkpoint), "args.json"), tmp_path / "run")
    monkeypatch.setattr("sys.argv", ["ppo_atari_envpool.py", "--resume", str(tmp_path / "run" / "checkpoint.pt")])
    args, resumed = ppo_atari_envpool.parse_args()
    assert (args.dormant_definition, args.dormant_threshold) == ("sokar", 0.1)
    assert resumed["global_step"] == 64


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_takes_the_specs_dormant_tau_as_sokars_threshold(name):
    args = tyro.cli(import_script(name).Args, args=["--dormant-tau", "0.1"])
    assert (args.dormant_definition, args.dormant_threshold) == ("sokar", 0.1)


@pytest.mark.parametrize("name", SCRIPTS)
def test_lr_scaling_inverse_sqrt_divides_the_lr_by_the_root_of_the_env_multiplier(name):
    """k = 32 / 8 = 4: 2.5e-4 / sqrt(4) = 1.25e-4; annealed, half of it halfway (the main study's Fig. 11 goes down too)."""
    module = import_script(name)
    assert "inverse-sqrt" in typing.get_args(typing.get_type_hints(module.Args)["lr_scaling"])
    flags = dict(learning_rate=2.5e-4, lr_scaling="inverse-sqrt", lr_reference_envs=8, anneal_lr=False, planned_steps=1000)
    args = SimpleNamespace(**flags)  # the fields that learning_rate reads (a script's Args may derive planned_steps)
    assert module.learning_rate(args, 32, 0) == pytest.approx(1.25e-4)
    assert module.learning_rate(args, 8, 0) == pytest.approx(2.5e-4)  # k = 1
    args.anneal_lr = True
    assert module.learning_rate(args, 32, 500) == pytest.approx(6.25e-5)
    assert module.learning_rate(args, 2, 0) == pytest.approx(2.5e-4 * math.sqrt(4))  # fewer envs: k = 1/4, the LR doubles
