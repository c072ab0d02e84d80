"""mujoco_warp_tasks.py against Gymnasium's Ant-v5 and Humanoid-v5 (the `mujoco` bindings, float64): the same states,
the same actions, the same observations, rewards and terminations within the stated tolerances.

What cannot be made equal: from the first ground contact, MuJoCo Warp 4.0.0's constraint solution differs from
MuJoCo's with the models' pyramidal friction cones (measured at the Ant's first contact: the same 4 contacts at the same
distances, but other reference accelerations efc_aref for the pyramid's edges, and qacc 1 % apart), so trajectories
with contacts drift apart. The tests therefore check the tasks (a) in the air, where the XML models run as they are,
falls and terminations included, and (b) with contacts under elliptic friction cones, set on both sides, where
MuJoCo Warp and MuJoCo agree (qacc within 5e-5 of 230 at that contact): that covers the contact forces of the
observations and the contact costs.
"""

import gymnasium
import mujoco
import numpy as np
import pytest
import torch

mujoco_warp_tasks = None  # imported when a test here runs: at collection, MuJoCo Warp's import cost each test process 3 s


@pytest.fixture(autouse=True, scope="module")
def import_mujoco_warp_tasks():
    global mujoco_warp_tasks  # noqa: PLW0603
    mujoco_warp_tasks = pytest.importorskip("mujoco_warp_tasks")  # needs mujoco-warp (requirements.txt)


# float32 against float64 over a few dozen steps of 5 substeps each
ATOL, RTOL = 2e-3, 2e-3


def make_pair(name, monkeypatch=None, num_worlds=2):
    """num_worlds Gymnasium environments and a WarpTasks of as many worlds on the CPU, with the same solver: Newton
    (Humanoid's XML asks for PGS, which MuJoCo Warp lacks). With monkeypatch, both sides use elliptic friction cones."""
    references = [gymnasium.make(f"{name}-v5").unwrapped for _ in range(num_worlds)]
    for reference in references:
        reference.model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        if monkeypatch:
            reference.model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    if monkeypatch:
        load_model = mujoco_warp_tasks.load_model
        monkeypatch.setattr(mujoco_warp_tasks, "load_model", lambda task: elliptic(load_model(task)))
    return references, mujoco_warp_tasks.WarpTasks(name, num_worlds, seed=0, device=torch.device("cpu"))


def elliptic(model):
    model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    return model


def put_in_state(references, envs, qpos, qvel):
    """The same state everywhere; returns both sides' observations."""
    for reference, world_qpos, world_qvel in zip(references, qpos, qvel, strict=True):
        reference.reset(seed=0)
        reference.set_state(world_qpos, world_qvel)
    observations = np.stack([reference._get_obs() for reference in references])
    return observations, envs.set_state(torch.tensor(qpos, dtype=torch.float32), torch.tensor(qvel, dtype=torch.float32))


def compare_steps(references, envs, steps, seed=0, action_scale=1.0):
    """Step both sides with the same random actions until the steps run out or every reference episode has ended;
    returns the (step, world) pairs that terminated and the largest contact force seen. A Gymnasium environment is not
    stepped past its end."""
    rng = np.random.default_rng(seed)
    ended, terminated, largest_force = np.zeros(len(references), dtype=bool), [], 0.0
    for step in range(steps):
        actions = (rng.uniform(-1, 1, size=(len(references), envs.action_space.shape[0])) * action_scale).astype(np.float32)
        obs, rewards, terminations, truncations = (x.numpy() for x in envs.step(torch.tensor(actions)))
        for world, reference in enumerate(references):
            if ended[world]:
                continue
            ref_obs, ref_reward, ref_terminated, ref_truncated, _ = reference.step(actions[world].astype(np.float64))
            np.testing.assert_allclose(obs[world], ref_obs, rtol=RTOL, atol=ATOL, err_msg=f"observation, step {step}")
            assert rewards[world] == pytest.approx(ref_reward, rel=RTOL, abs=ATOL), (step, world)
            assert bool(terminations[world]) == ref_terminated and not truncations[world], (step, world)
            largest_force = max(largest_force, np.abs(reference.data.cfrc_ext).max())
            if ref_terminated:
                ended[world] = True
                terminated.append((step, world))
        if ended.all():
            break
    return terminated, largest_force


def test_ant_in_the_air_and_its_terminations():
    """World 0 starts at z = 4, above the healthy range (0.2 <= z <= 1): terminated at the first step. World 1 starts at
    z = 0.85 moving up at 2 m/s, legs off the ground: healthy steps, then terminated once the torso passes z = 1."""
    references, envs = make_pair("Ant")
    qpos = np.stack([references[0].init_qpos] * 2)
    qpos[:, 2] = [4.0, 0.85]
    qvel = np.random.default_rng(1).normal(0, 0.1, (2, references[0].model.nv))
    qvel[1, 2] = 2.0
    reference_obs, obs = put_in_state(references, envs, qpos, qvel)
    np.testing.assert_allclose(obs.numpy(), reference_obs, rtol=RTOL, atol=ATOL)
    terminated, largest_force = compare_steps(references, envs, steps=40)
    assert largest_force == 0.0 and terminated[0] == (0, 0) and terminated[1][0] >= 1  # no contact; healthy steps first


def test_humanoid_falls_in_the_air_and_terminates():
    """Lying on its back at z = 1.4 (healthy: 1 < z < 2), the Humanoid falls below z = 1 before any limb reaches the
    ground: healthy steps, then the termination (its limbs may touch each other on the way: self-contacts)."""
    references, envs = make_pair("Humanoid")
    qpos = np.stack([references[0].init_qpos] * 2)
    qpos[:, 2] = 1.4
    qpos[:, 3:7] = [np.cos(np.pi / 4), 0.0, -np.sin(np.pi / 4), 0.0]  # rotated -90 degrees about y: on its back
    qvel = np.random.default_rng(2).uniform(-0.01, 0.01, (2, references[0].model.nv))
    reference_obs, obs = put_in_state(references, envs, qpos, qvel)
    np.testing.assert_allclose(obs.numpy(), reference_obs, rtol=RTOL, atol=ATOL)
    terminated, _ = compare_steps(references, envs, steps=40, action_scale=0.4)
    assert sorted(world for _, world in terminated) == [0, 1] and all(step > 10 for step, _ in terminated)


@pytest.mark.parametrize("name", ["Ant", "Humanoid"])
def test_contacts_under_elliptic_cones(name, monkeypatch):
    """From Gymnasium's own reset states, through the first ground contacts: the contact forces in the observations and
    the contact costs in the rewards."""
    references, envs = make_pair(name, monkeypatch)
    for world, reference in enumerate(references):
        reference.reset(seed=world)
    qpos = np.stack([reference.data.qpos for reference in references])
    qvel = np.stack([reference.data.qvel for reference in references])
    put_in_state(references, envs, qpos, qvel)
    _, largest_force = compare_steps(references, envs, steps=12 if name == "Ant" else 22, action_scale=0.3)
    assert largest_force > 1.0  # the comparison went through contacts


@pytest.mark.parametrize("name", ["Ant", "Humanoid"])
def test_a_world_whose_state_went_nan_terminates_finite_and_restarts_finite(name):
    """A NaN state (an unstable simulation) ends the world's episode (Ant's finite-state health check; Humanoid's
    health check reads only the height, still finite after a NaN velocity): its last observation and reward are 0, not
    NaN, so that no NaN reaches the normalisers or the loss; its reset step is the new episode's finite first
    observation with reward 0, not NaN * 0; the other worlds go on."""
    envs = mujoco_warp_tasks.WarpTasks(name, 4, seed=0, device=torch.device("cpu"))
    envs.reset()
    envs.qvel[0, 0] = float("nan")
    actions = torch.zeros(4, envs.action_space.shape[0])
    obs, rewards, terminations, _ = envs.step(actions)
    assert terminations.tolist() == [1, 0, 0, 0] and obs.isfinite().all() and rewards.isfinite().all()
    assert not obs[0].any() and rewards[0] == 0 and obs[1:].any(1).all()
    obs, rewards, terminations, _ = envs.step(actions)  # world 0's reset step
    assert obs[0].isfinite().all() and obs[0].any() and rewards[0] == 0 and terminations[0] == 0


def test_reset_step_time_limit_and_reset_noise():
    """EnvPool's convention: the step after an episode ends returns the next episode's first observation with reward 0;
    a time-limit end is a truncation; the reset noise follows Gymnasium's (qpos uniform in +-0.1 around qpos0; qvel
    0.1 * N(0, 1) for Ant)."""
    envs = mujoco_warp_tasks.WarpTasks("Ant", 64, seed=3, device=torch.device("cpu"), max_episode_steps=2)
    obs = envs.reset()
    init_qpos = torch.tensor(envs.mj_model.qpos0, dtype=torch.float32)
    assert 0.09 < (envs.qpos - init_qpos).abs().max() <= 0.1 and 0.07 < envs.qvel.std() < 0.13  # noise, in its range
    assert obs.shape == (64, 105) and torch.equal(obs[:, 27:], torch.zeros(64, 78))  # no contact forces at a reset
    zero = torch.zeros(64, 8)
    _, _, terminations, truncations = envs.step(zero)
    assert not truncations.any() and not terminations.any()
    _, _, terminations, truncations = envs.step(zero)  # the 2-step time limit
    assert torch.equal(truncations, torch.ones(64)) and not terminations.any()
    obs, rewards, terminations, truncations = envs.step(zero)  # every world restarts: the reset step
    assert torch.equal(rewards, torch.zeros(64)) and not terminations.any() and not truncations.any()
    assert (envs.elapsed == 0).all() and (envs.qpos - init_qpos).abs().max() <= 0.1


def test_healthy_range_edges_and_the_humanoids_contact_cost_cap(monkeypatch):
    """Gymnasium's rules at their edges: Ant is healthy at z = 0.2 and at z = 1 (inclusive range), the Humanoid is not
    at z = 1 nor at z = 2 (exclusive); the Humanoid's contact cost stops at 10 however large the forces."""
    for name, edges, healthy in (("Ant", (0.2, 1.0), [True, True]), ("Humanoid", (1.0, 2.0), [False, False])):
        envs = mujoco_warp_tasks.WarpTasks(name, 2, seed=0, device=torch.device("cpu"))
        qpos = envs.qpos.clone()
        qpos[:, 2] = torch.tensor(edges)
        envs.set_state(qpos, torch.zeros_like(envs.qvel))
        assert envs.healthy().tolist() == healthy, name
    monkeypatch.setattr(envs, "contact_forces", lambda: torch.full((2, 13, 6), 1e6))
    actions = torch.zeros(2, envs.action_space.shape[0])
    assert envs.reward(torch.zeros(2), actions, torch.zeros(2, dtype=torch.bool)).tolist() == pytest.approx([-10.0, -10.0])
