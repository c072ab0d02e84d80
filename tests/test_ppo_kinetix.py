"""ppo_kinetix.py: the MultiDiscrete policy, Kinetix's same-step reset and time-outs in GAE, the solve rate, DLPack
without copies, one compilation of the step, a tiny run with every tag, SIGTERM and --resume, torchrun, bad inputs.

The environments are Kinetix's S levels (a few envs): its batched step compiles in about 30 s on 2 cores the first
time, then JAX's persistent compilation cache (--jax-cache-dir, shared by every test) loads it in about a second."""

import copy
import dataclasses
import importlib.util
import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before JAX loads, as ppo_kinetix.py sets it: XLA's warnings
pytest.importorskip("kinetix", reason="needs Kinetix (make setup: requirements-nodeps.txt)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from conftest import (  # noqa: E402
    PPO_TAGS,
    ROOT,
    assert_optimizer_went_on,
    only_run_dir,
    read_scalars,
    run_main,
    run_script,
    run_torchrun,
    stop_after_first_checkpoint,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_kinetix  # noqa: E402

jax.config.update("jax_compilation_cache_dir", ppo_kinetix.Args().jax_cache_dir)  # the runs' cache: compiled once

SCRIPT = "ppo_kinetix.py"
# 4 iterations of 16 envs x 32 steps on Kinetix's 10 hand-designed S levels, 8 minibatches of 64
TINY = "--task-set handmade --env-size s --num-envs 16 --num-steps 32 --total-timesteps 2048 --num-minibatches 8 --no-cuda"
TINY = TINY.split()
KINETIX_TAGS = PPO_TAGS | {
    "charts/solve_rate",
    "charts/solve_rate_handmade",
    "charts/success_rate",
    "metrics/feature_rank_critic",
}


# ---- The policy and the maths on hand-made tensors ----
def test_defaults_are_table_2_and_kinetixs_own_reward():
    """Beukman et al.'s Table 2 (Jax2D locomotion) and the shaping of Kinetix's configs, which they use (0.2, where
    Kinetix's EnvParams say 0.1)."""
    table_2 = {"gamma": 0.995, "gae_lambda": 0.9, "num_envs": 2048, "num_steps": 256, "update_epochs": 8}
    table_2 |= {"num_minibatches": 32, "clip_coef": 0.2, "clip_vloss": True, "vf_coef": 0.5, "ent_coef": 0.01}
    table_2 |= {"max_grad_norm": 0.5, "learning_rate": 3e-4, "anneal_lr": False, "dense_reward_scale": 0.2}
    args = dataclasses.asdict(ppo_kinetix.Args())
    assert {name: args[name] for name in table_2} == table_2


def test_multi_discrete_head_matches_one_categorical_per_head():
    agent = ppo_kinetix.Agent(140, separate_networks=True)
    obs = torch.randn(5, 140)
    action, log_prob, entropy, value, logits = agent.get_action_and_value(obs)
    assert action.shape == (5, 6) and logits.shape == (5, 16) and value.shape == (5,)
    heads = [torch.distributions.Categorical(logits=part) for part in logits.split(ppo_kinetix.ACTION_SIZES, dim=-1)]
    expected_log_prob = sum(head.log_prob(action[:, i]) for i, head in enumerate(heads))
    torch.testing.assert_close(log_prob, expected_log_prob)
    torch.testing.assert_close(entropy, sum(head.entropy() for head in heads))
    assert (action[:, 4:] <= 1).all() and (action <= 2).all()  # the thrusters' heads have 2 actions: 2 is never drawn


def test_sampled_actions_follow_the_heads_probabilities():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 0.0, -1.0] * 4 + [0.0, 1.0] * 2]).expand(20000, -1)
    actions = ppo_kinetix.sample_actions(ppo_kinetix.head_log_probs(logits))
    frequencies = torch.stack([(actions[:, 0] == a).float().mean() for a in range(3)])
    torch.testing.assert_close(frequencies, torch.softmax(logits[0, :3], -1), atol=0.015, rtol=0)
    torch.testing.assert_close((actions[:, 5] == 1).float().mean(), torch.sigmoid(torch.tensor(1.0)), atol=0.015, rtol=0)


def test_gae_stops_at_a_termination_and_bootstraps_a_time_out_from_the_last_state():
    """One env, 4 steps: the episode reaches the goal at t = 1 (Kinetix's same-step reset: values[2] is the next
    episode's first state, not a successor), the next one times out at t = 3 with V(last state) = 5."""
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.1], [1.0], [0.2], [0.3]])
    values = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    dones = torch.tensor([[0.0], [1.0], [0.0], [1.0]])
    truncation_values = torch.tensor([[0.0], [0.0], [0.0], [5.0]])
    next_value = torch.tensor([7.0])  # the state after the rollout: another episode's, not used
    advantages, returns = ppo_kinetix.compute_gae(rewards, values, dones, truncation_values, next_value, gamma, lam)
    delta3 = 0.3 + gamma * 5.0 - 4.0  # the time-out: bootstraps from its own last state
    delta2 = 0.2 + gamma * 4.0 - 3.0
    delta1 = 1.0 - 2.0  # the goal: no future
    delta0 = 0.1 + gamma * 2.0 - 1.0
    expected = [delta0 + gamma * lam * delta1, delta1, delta2 + gamma * lam * delta3, delta3]
    torch.testing.assert_close(advantages[:, 0], torch.tensor(expected))
    torch.testing.assert_close(returns, advantages + values)


def test_ppo_ewma_with_the_behaviour_as_proximal_policy_has_ppos_gradients():
    torch.manual_seed(0)
    agent = ppo_kinetix.Agent(140, separate_networks=False)
    behaviour = copy.deepcopy(agent)  # the policy that collected the minibatch
    obs = torch.randn(32, 140)
    with torch.no_grad():
        actions, logprobs, _, values, _ = behaviour.get_action_and_value(obs)
        for parameter in agent.parameters():  # a step away from it, so that ratios and clipping matter
            parameter.add_(0.05 * torch.randn_like(parameter))
    minibatch = {"obs": obs, "actions": actions, "logprobs": logprobs, "values": values, "valid": torch.ones(32)}
    minibatch |= {"advantages": torch.randn(32), "returns": torch.randn(32)}
    statistics = ppo_kinetix.minibatch_statistics(minibatch)
    args, clip = ppo_kinetix.Args(), torch.tensor(0.2)
    gradients, logged = [], []
    for proximal in (None, behaviour):
        agent.zero_grad()
        logged.append(ppo_kinetix.compute_gradients(agent, proximal, minibatch, statistics, args, clip))
        gradients.append([p.grad.clone() for p in agent.parameters()])
    for ppo, ewma in zip(*gradients, strict=True):
        torch.testing.assert_close(ppo, ewma)
    assert logged[0]["clipfrac"] == logged[1]["clipfrac"] > 0  # the step was large enough to clip


def test_behavior_kl_is_the_joint_kl_from_the_behaviour_policy():
    """--target-ddr's KL on iterations without metrics: the same number as measure_agent's kl_behavior."""
    torch.manual_seed(0)
    agent, obs = ppo_kinetix.Agent(140, separate_networks=True), torch.randn(64, 140)
    with torch.no_grad():
        behavior_logits = agent.actor(agent.features(obs)[0]) + 0.3 * torch.randn(64, 16)
    actions = torch.zeros(64, 6, dtype=torch.long)
    measured = ppo_kinetix.measure_agent(agent, obs, actions, behavior_logits, 512, 0.025, proximal=agent)
    assert ppo_kinetix.behavior_kl(agent, obs, behavior_logits) == pytest.approx(measured["kl_behavior"])
    assert measured["kl_behavior"] > 0
    assert measured["kl_prox"] == 0.0  # the proximal policy is the updated one


# ---- The environment ----
def test_dlpack_shares_memory_both_ways():
    """What KinetixTasks.step does with the batch: torch reads JAX's observations in place, JAX torch's actions."""
    observations = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    as_torch = torch.from_dlpack(observations)
    assert as_torch.data_ptr() == observations.unsafe_buffer_pointer()
    actions = torch.arange(18, dtype=torch.int32).reshape(3, 6)
    as_jax = jax.dlpack.from_dlpack(actions)
    assert as_jax.unsafe_buffer_pointer() == actions.data_ptr()


def test_kinetix_tasks_step_in_place_and_compile_once(monkeypatch, kinetix_step):
    envs = kinetix_step  # TINY's, its first step taken: compiled once for all
    compiled = envs.batched_step._cache_size(), envs.first_states._cache_size()
    received = []  # the JAX arrays that the step's tensors come from
    original = torch.from_dlpack
    monkeypatch.setattr(torch, "from_dlpack", lambda array: received.append(array) or original(array))
    obs = envs.start()
    assert obs.shape == (16, 140) and obs.dtype == torch.float32 and envs.obs_dim == 140
    for _ in range(3):
        received.clear()
        with jax.transfer_guard("disallow"):  # no copy between host and device: the batch crosses through DLPack
            obs, last_obs, outcome = envs.step(torch.randint(0, 2, (16, 6)))
        assert obs.shape == last_obs.shape == (16, 140) and outcome.shape == (16, 4)
        assert [t.data_ptr() for t in (obs, last_obs, outcome)] == [a.unsafe_buffer_pointer() for a in received]
    monkeypatch.setattr(torch, "from_dlpack", original)
    training_states = envs.states
    ppo_kinetix.solve_rate(ppo_kinetix.Agent(140, True), envs, envs.levels, attempts=1)  # played with the same step
    assert envs.states is training_states  # the training's episodes go on after an evaluation
    envs.start()
    # the first call's types are the later calls' types; another KinetixTasks of these parameters shares the compiled calls
    assert (envs.batched_step._cache_size(), envs.first_states._cache_size()) == compiled
    args = ppo_kinetix.Args(task_set="handmade", env_size="s", num_envs=8)
    other = ppo_kinetix.KinetixTasks(ppo_kinetix.task_set(args, "", handmade=True), 8, torch.device("cpu"), seed=1)
    assert (other.batched_step, other.first_states) == (envs.batched_step, envs.first_states)


def jax_gpus() -> int:
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:  # JAX's CPU build, or no GPU
        return 0


needs_jax_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or jax_gpus() == 0, reason="needs a CUDA GPU and JAX's CUDA build (make kinetix-cuda)"
)


@needs_jax_gpu
def test_on_the_gpu_the_batch_crosses_in_place_with_no_host_copy_and_the_step_compiles_once(monkeypatch):
    """torch's cuda:0 and JAX's first GPU: every crossing (observations, outcomes to torch; actions to JAX) keeps its
    buffer on the GPU, no array goes to or from the host (JAX's transfer guard), the step compiles once, and JAX
    holds only what it uses of the GPU's memory (ppo_kinetix.py turns XLA's preallocation of 75 % off)."""
    args = ppo_kinetix.Args(task_set="handmade", env_size="s", num_envs=16)
    envs = ppo_kinetix.KinetixTasks(ppo_kinetix.task_set(args, "", handmade=True), 16, torch.device("cuda:0"), 0)
    assert envs.device == jax.devices("gpu")[0]
    crossings = []  # (torch's device, torch's data pointer, JAX's buffer pointer)
    to_torch, to_jax = torch.from_dlpack, jax.dlpack.from_dlpack

    def jax_to_torch(array):
        tensor = to_torch(array)
        crossings.append((tensor.device, tensor.data_ptr(), array.unsafe_buffer_pointer()))
        return tensor

    def torch_to_jax(tensor):
        array = to_jax(tensor)
        crossings.append((tensor.device, tensor.data_ptr(), array.unsafe_buffer_pointer()))
        return array

    monkeypatch.setattr(torch, "from_dlpack", jax_to_torch)
    monkeypatch.setattr(jax.dlpack, "from_dlpack", torch_to_jax)
    compiled, sizes = envs.batched_step._cache_size(), []  # the step's compilations so far (on the CPU: other tests')
    obs = envs.start()
    with jax.transfer_guard("disallow"):
        for _ in range(3):
            obs, last_obs, outcome = envs.step(torch.randint(0, 2, (16, 6), device="cuda"))
            sizes.append(envs.batched_step._cache_size())
    monkeypatch.undo()
    assert len(crossings) == 1 + 3 * 4  # start's observations; each step's actions, observations, last ones, outcome
    assert all(device == torch.device("cuda", 0) and pointer == buffer for device, pointer, buffer in crossings)
    assert obs.shape == last_obs.shape == (16, 140) and outcome.shape == (16, 4)
    assert sizes == [compiled + 1] * 3  # compiled for the GPU at the first step, not again
    free, total = torch.cuda.mem_get_info()
    assert free > total / 2


@needs_jax_gpu
def test_tiny_run_trains_checkpoints_and_resumes_on_the_gpu(tmp_path):
    """TINY on cuda:0 (JAX and torch): every tag, then the finished run's budget doubled in its checkpoint and
    --resume trains 4 more iterations on the GPU, from the checkpoint's optimizer and task set."""
    assert TINY[-1] == "--no-cuda"
    flags = [*TINY[:-1], "--metrics-interval", "2", "--eval-interval", "2", "--checkpoint-interval", "2"]
    result = run_script(SCRIPT, *flags, "--runs-dir", str(tmp_path), cuda=True)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert KINETIX_TAGS <= set(read_scalars(run_dir)), KINETIX_TAGS - set(read_scalars(run_dir))
    assert json.load(open(os.path.join(run_dir, "args.json")))["device"] == torch.cuda.get_device_name()
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    checkpoint["args"]["total_timesteps"] = 4096
    torch.save(checkpoint, checkpoint_path)
    os.remove(os.path.join(run_dir, "done.json"))  # not finished any more: --resume takes it
    resumed = run_script(SCRIPT, "--resume", checkpoint_path, cuda=True)
    assert resumed.returncode == 0 and "resumed at iteration 5" in resumed.stdout, resumed.stderr
    assert json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 4096, "iterations": 8}
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [512 * i for i in range(1, 9)]
    assert_optimizer_went_on(torch.load(checkpoint_path, weights_only=True))


def test_a_time_out_is_a_truncation_with_its_last_observation_and_a_new_level(kinetix_step):
    """Kinetix's time limit (256 steps), no-op actions on the S levels: at the limit every episode that did not end
    otherwise is truncated, not terminated; the observation to act on is a new level's first, the last observation the
    ended episode's own (its successor of the step before)."""
    envs, noop = kinetix_step, torch.zeros(16, 6, dtype=torch.long)
    assert envs.max_timesteps == 256
    envs.start(envs.levels, torch.arange(16) % 10)
    ended_early = torch.zeros(16, dtype=torch.bool)
    for _ in range(envs.max_timesteps - 1):
        obs, last_obs, outcome = envs.step(noop)
        ended_early |= outcome[:, 1:3].sum(1) > 0
    assert not ended_early.all()
    # before the time-out, where nothing ended, both are the same state
    torch.testing.assert_close(obs[~ended_early], last_obs[~ended_early])
    obs, last_obs, outcome = (x.clone() for x in envs.step(noop))
    reward, terminated, truncated, solved = outcome[~ended_early].unbind(1)
    assert truncated.bool().all() and not terminated.any() and not solved.any()
    starts = envs.start(envs.levels, torch.arange(16) % 10).clone()  # every level's first observation
    for env in torch.nonzero(~ended_early).squeeze(1).tolist():
        assert any(torch.equal(obs[env], start) for start in starts)  # a new episode, of a level of the set
        assert not torch.equal(last_obs[env], obs[env])  # its own last state, not the next episode's


def test_episode_end_tells_the_time_limit_from_a_contact_whatever_the_shaping():
    """Kinetix's reward is the contact's +-1 plus 0.1 x the decrease in distance to the goal; done at the time limit
    (256). Six steps: (reward, done, timestep, distance after, distance before, finite)."""
    params = ppo_kinetix.import_kinetix().EnvParams()
    assert (params.max_timesteps, params.dense_reward_scale) == (256, 0.1)
    steps = [
        (-2.1, True, 256, 26.0, 5.0, True),  # the limit, no contact: shaping 0.1 x (5 - 26) = -2.1, a truncation
        (0.4, True, 256, 7.0, 1.0, True),  # the goal at the limit: 1 + 0.1 x (1 - 7) = 0.4, a termination
        (-1.0, True, 256, 3.0, -1.0, True),  # a red shape on an episode's first step (no distance before: no shaping)
        (0.0, True, 256, 3.0, -1.0, True),  # the limit on a first step: a truncation
        (0.0, True, 256, 3.0, 3.0, False),  # a non-finite state at the limit: a termination
        (-1.2, False, 255, 15.0, 3.0, True),  # a step with nothing ended, its shaping past -1
    ]
    reward, done, timestep, distance, last_distance, finite = (jnp.array(column) for column in zip(*steps, strict=True))
    terminated, truncated = ppo_kinetix.episode_end(reward, done, timestep, distance, last_distance, finite, params)
    assert terminated.tolist() == [False, True, True, False, True, False]
    assert truncated.tolist() == [True, False, False, True, False, False]


class ScriptedTasks:
    """A stand-in for KinetixTasks: level i's first episode ends at step OUTCOMES[i][0], solved or not; an episode
    never ends for None. Records the levels it is started on; its states say whose episodes it plays."""

    OUTCOMES = {0: (2, True), 1: (1, False), 2: (None, None)}  # level 1 solves its second episode (step 3): not counted

    def __init__(self, num_envs):
        self.num_envs, self.max_timesteps, self.started, self.states = num_envs, 40, [], "training"

    def start(self, levels, index):
        self.index, self.t, self.states = index, 0, "evaluation"
        self.started.append(index.tolist())
        return torch.zeros(self.num_envs, 140)

    def step(self, actions, levels):
        self.t += 1
        outcome = torch.zeros(self.num_envs, 4)
        for env, level in enumerate(self.index.tolist()):
            end, solved = self.OUTCOMES[level]
            if self.t == end:
                outcome[env, 1], outcome[env, 3] = 1.0, float(solved)
            elif level == 1 and self.t == 3:  # the second episode of level 1 reaches the goal
                outcome[env, 1], outcome[env, 3] = 1.0, 1.0
        return torch.zeros(self.num_envs, 140), torch.zeros(self.num_envs, 140), outcome


def test_solve_rate_counts_the_first_episode_of_each_attempt():
    """3 levels x 2 attempts in batches of 4 envs (the second filled up with level 0, which must not count): level
    0 solved both times, level 1 only in a second episode, level 2 never ends: 2 / 6."""
    envs = ScriptedTasks(num_envs=4)
    levels = {"leaf": jnp.zeros((3, 1))}
    rate = ppo_kinetix.solve_rate(ppo_kinetix.Agent(140, True), envs, levels, attempts=2)
    assert rate == pytest.approx(2 / 6)
    assert envs.started == [[0, 1, 2, 0], [1, 2, 0, 0]]
    assert envs.states == "training"  # the training's episodes, put back


def same_levels(a, b) -> bool:
    pairs = zip(jax.tree.leaves(a.levels), jax.tree.leaves(b.levels), strict=True)
    return all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in pairs)


def test_locomotion_tasks_are_drawn_once_from_the_task_seed_kept_and_read_back(tmp_path, monkeypatch):
    """The same seed draws the same set afresh (an empty cache), another seed another set; the next run reads the set
    from the cache (the sampler not called), a resumed run from its own tasks.npz."""

    def args(seed: int, cache: str) -> ppo_kinetix.Args:
        return ppo_kinetix.Args(task_set="locomotion", env_size="m", num_tasks=4, task_seed=seed, jax_cache_dir=cache)

    drawn = ppo_kinetix.task_set(args(3, str(tmp_path / "a")), str(tmp_path))
    again = ppo_kinetix.task_set(args(3, str(tmp_path / "b")), "")
    other = ppo_kinetix.task_set(args(4, str(tmp_path / "a")), "")
    monkeypatch.setattr(sys.modules["kinetix.environment.ued.locomotion_distribution"], "sample_locomotion_level", None)
    cached = ppo_kinetix.task_set(args(3, str(tmp_path / "a")), "")
    stored = ppo_kinetix.task_set(args(3, str(tmp_path / "b")), str(tmp_path), load=True)
    assert same_levels(drawn, again) and same_levels(drawn, cached) and same_levels(drawn, stored)
    assert not same_levels(drawn, other)
    assert len(list((tmp_path / "a").glob("kinetix-levels-*.npz"))) == 2
    assert stored.names == cached.names == drawn.names == [f"locomotion_{i}" for i in range(4)]
    assert jax.tree.leaves(drawn.levels)[0].shape[0] == 4


def test_a_bank_of_random_levels_is_drawn_once_kept_and_read_back(tmp_path, monkeypatch):
    """A bank of random S levels, drawn as Kinetix's PPO draws them: its no-op filter (twice as many levels sampled,
    64 no-op steps) and its sampler, each called as its signature asks, with the size class's parameters, one key per
    level; the next run reads the bank from the cache (the sampler not called), a resumed run from its tasks.npz.
    Stand-ins play both: JAX traces Kinetix's own in 10-25 s and compiles them in ~1-2 min on 2 cores (ppo_kinetix.py
    --task-set random runs them: 0 of 128 S levels solved by doing nothing, 28 without the filter)."""
    kx = ppo_kinetix.import_kinetix()  # first: the test may be its process's first to use Kinetix
    distributions = sys.modules["kinetix.environment.ued.distributions"]
    sampler = inspect.signature(distributions.sample_kinetix_level)
    level_filter, filtered = inspect.signature(distributions.create_vmapped_filtered_distribution), []

    def filter_stand_in(*args, **kwargs):
        call = level_filter.bind(*args, **kwargs).arguments
        filtered.append(call["n_samples"])
        assert call["do_filter_levels"] and (call["level_filter_sample_ratio"], call["level_filter_n_steps"]) == (2, 64)
        assert (call["n_samples"], call["env_size_name"], call["env_params"]) == (3, "s", kx.EnvParams(dense_reward_scale=0.5))
        assert call["static_env_params"] == kx.static_env_params_from_size("s") and callable(call["env"].step)
        keys = jax.random.split(call["rng"], call["n_samples"])
        return jax.vmap(call["level_sampler"])(keys), keys

    def stand_in(rng, *args, **kwargs):
        call = sampler.bind(rng, *args, **kwargs).arguments
        assert call["static_env_params"] == kx.static_env_params_from_size("s")
        assert call["env_params"] == kx.EnvParams(dense_reward_scale=0.5)  # --dense-reward-scale's
        assert isinstance(call["engine"], kx.PhysicsEngine) and isinstance(call["ued_params"], kx.UEDParams)
        level = kx.create_empty_env(call["static_env_params"])
        return level.replace(polygon=level.polygon.replace(position=level.polygon.position + jax.random.uniform(rng)))

    monkeypatch.setattr(distributions, "sample_kinetix_level", stand_in)
    monkeypatch.setattr(distributions, "create_vmapped_filtered_distribution", filter_stand_in)
    args = ppo_kinetix.Args(task_set="random", env_size="s", num_tasks=3, task_seed=5, dense_reward_scale=0.5)
    args.jax_cache_dir = str(tmp_path / "a")
    drawn = ppo_kinetix.task_set(args, str(tmp_path))
    assert filtered == [3]
    monkeypatch.setattr(distributions, "sample_kinetix_level", None)
    cached = ppo_kinetix.task_set(args, "")
    stored = ppo_kinetix.task_set(args, str(tmp_path), load=True)
    assert same_levels(drawn, cached) and same_levels(drawn, stored)
    assert stored.names == cached.names == drawn.names == ["random_0", "random_1", "random_2"]
    positions = drawn.levels.polygon.position
    assert positions.shape[0] == 3 and len({float(level.max()) for level in positions}) == 3  # three keys, three levels


def test_hand_designed_levels_are_parsed_once_then_read_back_identical(tmp_path, monkeypatch):
    names = "s/h0_weak_thrust.json,s/h1_thrust_over_ball.json"
    args = ppo_kinetix.Args(task_set="handmade", env_size="s", levels=names, jax_cache_dir=str(tmp_path))
    parsed = ppo_kinetix.task_set(args, "")
    assert len(list(tmp_path.glob("kinetix-levels-*.npz"))) == 1
    monkeypatch.setattr(sys.modules["kinetix.util.saving"], "load_evaluation_levels", None)  # not again
    cached = ppo_kinetix.task_set(args, "")
    assert same_levels(parsed, cached)
    assert cached.names == parsed.names == names.split(",")


# ---- Whole runs ----
@pytest.mark.usefixtures("kinetix_step")  # its step compiled once, not here as well
def test_tiny_ppo_ewma_run_stopped_by_sigterm_resumes_with_every_tag_on_the_same_tasks(tmp_path, monkeypatch, capsys):
    """PPO-EWMA in-process (plain PPO runs in the tests below): SIGTERM after iteration 1 saves and exits, --resume
    reads the task set back (the same file, not drawn again) and finishes; every tag, kl_prox too, and the proximal
    policy's weights and EWMA weight sum in the checkpoint, carried over the restart."""
    flags = [*TINY, "--ewma-com", "4", "--metrics-interval", "2", "--eval-interval", "2", "--runs-dir", str(tmp_path)]
    stop_after_first_checkpoint(monkeypatch, ppo_kinetix, flags)
    run_dir = only_run_dir(tmp_path)
    assert os.path.basename(run_dir).startswith("Kinetix-handmade-s__ppo_kinetix__1__")
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    assert torch.load(checkpoint_path, weights_only=True)["iteration"] == 1
    with np.load(os.path.join(run_dir, "tasks.npz")) as stored:
        tasks = dict(stored)
    assert len(tasks["names"]) == 10 and tasks["names"][0] == "s/h0_weak_thrust.json"
    inode = os.stat(os.path.join(run_dir, "tasks.npz")).st_ino  # write_atomically would make a new file
    capsys.readouterr()
    run_main(monkeypatch, ppo_kinetix, ["--resume", checkpoint_path])
    assert "solve rate on the 10 hand-designed S levels" in capsys.readouterr().out
    scalars = read_scalars(run_dir)
    assert KINETIX_TAGS | {"metrics/kl_prox"} <= set(scalars), KINETIX_TAGS - set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [512, 1024, 1536, 2048]  # each iteration once
    assert [step for step, _ in scalars["charts/solve_rate"]] == [1024, 2048]  # iterations 2 and 4
    assert all(0.0 <= value <= 1.0 for _, value in scalars["charts/solve_rate"] + scalars["charts/success_rate"])
    assert json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 2048, "iterations": 4}
    args = json.load(open(os.path.join(run_dir, "args.json")))
    assert args["env_id"] == "Kinetix-handmade-s" and args["script"] == SCRIPT
    assert os.stat(os.path.join(run_dir, "tasks.npz")).st_ino == inode
    with np.load(os.path.join(run_dir, "tasks.npz")) as stored:
        assert all(np.array_equal(stored[name], values) for name, values in tasks.items())
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert_optimizer_went_on(checkpoint)
    assert checkpoint["ewma_weight_sum"] == pytest.approx(sum(0.8**k for k in range(257)))  # 4 x 8 x 8 steps
    proximal, model = checkpoint["proximal"], checkpoint["model"]
    assert not all(torch.equal(proximal[name], model[name]) for name in model)  # behind the weights, not equal


def test_torchrun_two_processes_keep_identical_weights(tmp_path, kinetix_step):
    """32 envs over 2 processes: each steps TINY's 16, with the step that kinetix_step left in JAX's cache; one
    iteration (each process traces the step first, ~7 s on 2 busy cores), then both solve rates (the hand-designed
    levels' too: process 1 has no run directory of its own)."""
    flags = [*TINY, "--num-envs", "32", "--total-timesteps", "1024", "--runs-dir", str(tmp_path)]
    result = run_torchrun(SCRIPT, 2, *flags)
    assert result.returncode == 0, result.stderr
    assert "weights identical on 2 of 2 processes" in result.stdout
    run_dir = only_run_dir(tmp_path)
    assert json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 1024, "iterations": 1}
    scalars = read_scalars(run_dir)
    assert len(scalars["charts/solve_rate"]) == len(scalars["charts/solve_rate_handmade"]) == 1  # each process its share


# ---- Bad input: one line, exit 2, nothing created ----
BAD_FLAGS = [
    (["--task-set", "handmade", "--levels", "s/no_such_level.json"], "--levels: no hand-designed level s/no_such_level.json"),
    (["--num-tasks", "0"], "--num-tasks must be finite and > 0, got 0"),
    (["--task-set", "locomotion", "--env-size", "s"], "--task-set locomotion needs --env-size m or l"),
    (["--eval-attempts", "0"], "--eval-attempts must be finite and > 0"),
    (["--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch"),
    (["--total-timesteps", "100"], "smaller than one batch"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--dense-reward-scale", "nan"], "--dense-reward-scale must be finite and >= 0, got nan"),
    (["--target-ddr-final", "100"], "--target-ddr-final needs --target-ddr"),
]


@pytest.mark.parametrize("flags, fragment", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, flags, fragment):
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, ppo_kinetix, [*flags, "--runs-dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines
    assert not os.path.exists(tmp_path / "runs")


def test_unknown_size_class_is_tyros_one_line_error(tmp_path):
    result = run_script(SCRIPT, "--env-size", "xl", "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 2 and "xl" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "runs")


def test_without_jax_exits_2_naming_the_fix(tmp_path):
    blocker = tmp_path / "blocker"  # a jax package that cannot be imported, ahead of the real one
    (blocker / "jax").mkdir(parents=True)
    (blocker / "jax" / "__init__.py").write_text("raise ImportError('no jax here')\n")
    pythonpath = os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])
    result = run_script(SCRIPT, *TINY, "--runs-dir", str(tmp_path / "runs"), env={"PYTHONPATH": pythonpath})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "error: JAX is not installed: `make setup` installs it with Kinetix (requirements.txt)"
    assert not os.path.exists(tmp_path / "runs")


def test_kinetix_imports_without_gymnaxs_environments_and_gymnax_is_whole_afterwards():
    """import_kinetix leaves out gymnax's own environments (seaborn, scipy.stats: 2 s), in a process of its own: a
    later `import gymnax` (a variant of the script that uses it) still gets the whole package, with Kinetix's classes."""
    code = """
import sys, ppo_kinetix
kx = ppo_kinetix.import_kinetix()
skipped = "seaborn" not in sys.modules and "gymnax.environments.misc" not in sys.modules
import gymnax
from gymnax.environments.environment import Environment
whole = gymnax.make("CartPole-v1")[0].__class__.__name__ == "CartPole" and gymnax.EnvParams.__module__.startswith("gymnax.")
print(skipped, whole, issubclass(kx.make_kinetix_env.__globals__["KinetixEnv"], Environment))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)  # noqa: PLW1510
    assert result.returncode == 0 and result.stdout.split() == ["True", "True", "True"], result.stdout + result.stderr


def test_without_kinetix_exits_2_naming_the_fix(tmp_path, monkeypatch, capsys):
    """Kinetix not installed, in this process: find_spec finds no kinetix (it gave a traceback), its modules none."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "kinetix" else find_spec(name, *rest))
    monkeypatch.delitem(sys.modules, "kinetix.util", raising=False)
    monkeypatch.setitem(sys.modules, "kinetix.environment", None)  # its import raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, ppo_kinetix, [*TINY, "--runs-dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: Kinetix cannot be imported (") and "\n" not in line, line
    assert line.endswith("): `make setup` installs it (requirements-nodeps.txt)"), line
    assert not os.path.exists(tmp_path / "runs")


def test_jax_without_the_gpu_that_torch_uses_exits_2(tmp_path, monkeypatch, capsys):
    """torch sees a GPU, JAX (its CPU build) none."""
    devices = jax.devices

    def cpu_build_devices(backend=None):
        if backend == "gpu":  # what JAX's CPU build raises
            raise RuntimeError("Unknown backend: 'gpu' requested, but no platforms that are instances of gpu are present.")
        return devices(backend)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(jax, "devices", cpu_build_devices)
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, ppo_kinetix, ["--runs-dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: JAX cannot use cuda:0, the GPU that torch uses: make kinetix-cuda"), line
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.usefixtures("kinetix_step")  # its step compiled once, not here as well
def test_a_run_killed_while_it_evaluates_resumes_only_to_finish_on_its_own_tasks(tmp_path, monkeypatch, capsys):
    """The final checkpoint is written before the hand-designed levels' evaluation: a run that dies there (e.g.
    Slurm's SIGKILL after its SIGTERM) resumes, trains nothing more and finishes; without its tasks.npz, a resume is
    refused with one line before anything is opened."""
    original = ppo_kinetix.task_set

    def killed_in_evaluation(args, run_dir, load=False, handmade=False):
        if handmade:
            raise RuntimeError("killed while evaluating")
        return original(args, run_dir, load)

    monkeypatch.setattr(ppo_kinetix, "task_set", killed_in_evaluation)
    with pytest.raises(RuntimeError, match="killed while evaluating"):
        run_main(monkeypatch, ppo_kinetix, [*TINY, "--total-timesteps", "1024", "--runs-dir", str(tmp_path)])
    monkeypatch.setattr(ppo_kinetix, "task_set", original)
    run_dir = only_run_dir(tmp_path)
    assert not os.path.exists(os.path.join(run_dir, "done.json"))
    tasks, checkpoint = os.path.join(run_dir, "tasks.npz"), os.path.join(run_dir, "checkpoint.pt")
    os.rename(tasks, tasks + ".away")
    events = os.listdir(run_dir)
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, ppo_kinetix, ["--resume", checkpoint])
    assert exit_info.value.code == 2 and "tasks.npz is missing" in capsys.readouterr().err
    assert os.listdir(run_dir) == events  # no new event file
    os.rename(tasks + ".away", tasks)
    run_main(monkeypatch, ppo_kinetix, ["--resume", checkpoint])
    assert json.load(open(os.path.join(run_dir, "done.json"))) == {"global_step": 1024, "iterations": 2}
    scalars = read_scalars(run_dir)
    assert [step for step, _ in scalars["losses/policy_loss"]] == [512, 1024]  # each iteration once
    assert [step for step, _ in scalars["charts/solve_rate_handmade"]] == [1024]
