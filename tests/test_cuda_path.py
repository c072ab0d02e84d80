"""The CUDA path, checked on the CPU where possible and on a GPU where there is one.

On every machine: each script's maths (acting, rollout storage, advantages, the minibatch update, the metrics) runs on
tensors of another device than the CPU (conftest.GPU) under conftest.HostSyncs, which fails on an operation that mixes
devices and lists the operations that would make the host wait for a GPU. The step of the pixel scripts may wait once,
for the action copy that EnvPool needs; the update and the advantages never. Each script's own main() runs a tiny run on
the same fake GPU (conftest.fake_cuda), where the syncs of its step loop are counted. With a GPU (`make test` on a CUDA
machine), the scripts also run end to end on CUDA, compiled with CUDA graphs, and as 2 NCCL processes where 2 GPUs exist.
"""

import glob
import importlib.util
import json
import os
import re
import signal
import sys
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest
import torch
from conftest import (
    GPU,
    TOO_BIG_PHASE,
    HostSyncs,
    only_run_dir,
    read_scalars,
    run_script,
    run_torchrun,
    step_loop_lines,
    step_loop_syncs,
    usage_error,
)

import continuous_tasks
import metrics
import ppo_atari_envpool
import ppo_ewma_atari
import ppo_isaacgym
import ppo_procgen
import ppo_rnd_atari
import pqn_atari

HOST_COPY = ["copy to the host"]  # the action copy: EnvPool steps on the host


def pixel_step_storage(num_steps, num_envs, obs_shape, memory_format, num_actions, fields=("logprobs", "values")):
    """Rollout storage as the scripts allocate it, on the GPU: frames in the network's layout, then the other fields."""
    frames = torch.empty((num_steps * num_envs, *obs_shape), dtype=torch.uint8, device=GPU, memory_format=memory_format)
    rollout = {
        "obs": frames.zero_().unflatten(0, (num_steps, num_envs)),
        "actions": torch.zeros(num_steps, num_envs, dtype=torch.long, device=GPU),
        "logits": torch.zeros(num_steps, num_envs, num_actions, device=GPU),
    }
    return rollout | {name: torch.zeros(num_steps, num_envs, device=GPU) for name in fields}


def copy_frames_to_device(next_obs):
    """The end of a step: EnvPool's frames from (pinned) host memory to the device, without waiting."""
    host_obs = torch.zeros(next_obs.shape, dtype=torch.uint8)
    next_obs.copy_(host_obs, non_blocking=True)


@pytest.mark.parametrize("module", [ppo_atari_envpool, ppo_ewma_atari, ppo_procgen], ids=lambda m: m.__name__)
@pytest.mark.parametrize("channels_last", [True, False])
def test_ppo_step_waits_for_the_gpu_only_for_the_action_copy(module, channels_last):
    obs_shape = (3, 64, 64) if module is ppo_procgen else (4, 84, 84)
    agent = module.Agent(num_actions=6, separate_networks=True, channels_last=channels_last).to(GPU)
    rollout = pixel_step_storage(4, 8, obs_shape, agent.memory_format, 6)
    next_obs = torch.zeros((8, *obs_shape), dtype=torch.uint8, device=GPU)
    with HostSyncs() as syncs:
        for step in range(2):
            rollout["obs"][step] = next_obs
            with torch.inference_mode():
                action, logprob, _, value, logits = agent.get_action_and_value(next_obs)
            rollout["actions"][step], rollout["logprobs"][step] = action, logprob
            rollout["values"][step], rollout["logits"][step] = value, logits
            action.cpu()
            copy_frames_to_device(next_obs)
    assert syncs.calls == HOST_COPY * 2
    assert rollout["obs"].flatten(0, 1).is_contiguous(memory_format=agent.memory_format)  # no copy to lay it out


def test_procgen_reward_scaling_of_a_step_does_not_wait():
    return_rms = ppo_procgen.RunningMeanStd().to(GPU)
    rewards, valid, dones, discounted = (torch.zeros(8, device=GPU) for _ in range(4))
    with HostSyncs() as syncs:
        ppo_procgen.scale_rewards(rewards, valid, dones, discounted, return_rms, 0.999, 10.0)
    assert syncs.calls == []


def test_pqn_step_waits_for_the_gpu_only_for_the_action_copy():
    q_network = pqn_atari.QNetwork(6).to(GPU)
    rollout = pixel_step_storage(4, 8, (4, 84, 84), q_network.memory_format, 6, fields=("max_q",))
    next_obs = torch.zeros((8, 4, 84, 84), dtype=torch.uint8, device=GPU)
    with HostSyncs() as syncs:
        rollout["obs"][0] = next_obs
        with torch.inference_mode():
            q_values = q_network(next_obs)
            action = pqn_atari.epsilon_greedy(q_values, 0.1)
        rollout["actions"][0], rollout["max_q"][0] = action, q_values.max(dim=-1).values
        action.cpu()
        copy_frames_to_device(next_obs)
    assert syncs.calls == HOST_COPY


def test_rnd_step_waits_for_the_gpu_only_for_the_action_copy():
    agent, rnd = ppo_rnd_atari.Agent(6, False).to(GPU), ppo_rnd_atari.RNDModel().to(GPU)
    obs_rms = ppo_rnd_atari.RunningMeanStd(ppo_rnd_atari.FRAME_SHAPE).to(GPU)
    rollout = pixel_step_storage(
        4, 8, (4, 84, 84), agent.memory_format, 6, ("logprobs", "ext_values", "int_values", "rnd_errors")
    )
    rollout["next_frames"] = torch.zeros(4, 8, *ppo_rnd_atari.FRAME_SHAPE, dtype=torch.uint8, device=GPU)
    next_obs = torch.zeros((8, 4, 84, 84), dtype=torch.uint8, device=GPU)
    with HostSyncs() as syncs:
        rollout["obs"][0] = next_obs
        with torch.inference_mode():
            action, logprob, _, ext_value, int_value, logits = agent.get_action_and_value(next_obs)
        rollout["actions"][0], rollout["logprobs"][0], rollout["logits"][0] = action, logprob, logits
        rollout["ext_values"][0], rollout["int_values"][0] = ext_value, int_value
        action.cpu()
        copy_frames_to_device(next_obs)
        rollout["next_frames"][0] = next_obs[:, -1:]
        with torch.inference_mode():
            rollout["rnd_errors"][0] = rnd(ppo_rnd_atari.normalise_frames(next_obs[:, -1:], obs_rms))
    assert syncs.calls == HOST_COPY


def test_continuous_step_does_not_wait_for_the_gpu():
    """Isaac Gym and MuJoCo Warp take the actions on the device: no copy at all."""
    agent = ppo_isaacgym.Agent(obs_dim=5, action_dim=2, separate_networks=False).to(GPU)
    obs_rms, return_rms = ppo_isaacgym.RunningMeanStd((5,)).to(GPU), ppo_isaacgym.RunningMeanStd().to(GPU)
    raw_obs, rewards, valid, dones, discounted = torch.zeros(8, 5, device=GPU), *(torch.zeros(8, device=GPU) for _ in range(4))
    with HostSyncs() as syncs:
        next_obs = ppo_isaacgym.normalise_observations(raw_obs, obs_rms, 5.0)
        with torch.inference_mode():
            action, logprob, _, value, mean = agent.get_action_and_value(next_obs)
        ppo_isaacgym.scale_rewards(rewards, valid, dones, discounted, return_rms, 0.99, 5.0)
    assert syncs.calls == []


def test_envpool_mujoco_step_waits_for_the_gpu_only_for_the_action_copy():
    """ppo_isaacgym's EnvPool backend: what a step returns goes to the GPU in one copy that does not wait for it."""
    args = SimpleNamespace(env_id="Ant-v5", max_episode_steps=None)
    envs = continuous_tasks.EnvPoolTasks(args, num_envs=4, seed=1, device=GPU)
    with HostSyncs() as syncs:
        envs.reset()
        syncs.calls.clear()  # the first observations are copied once, before training
        envs.step(torch.zeros(4, envs.action_space.shape[0], device=GPU))
    assert syncs.calls == HOST_COPY


def categorical_minibatch(num_actions=6, obs_shape=(4, 84, 84), size=16):
    return {
        "obs": torch.zeros((size, *obs_shape), dtype=torch.uint8, device=GPU),
        "actions": torch.zeros(size, dtype=torch.long, device=GPU),
        "logits": torch.zeros(size, num_actions, device=GPU),
        **{name: torch.zeros(size, device=GPU) for name in ("logprobs", "values", "advantages", "returns", "valid")},
    }


@pytest.mark.parametrize("module", [ppo_atari_envpool, ppo_ewma_atari, ppo_procgen], ids=lambda m: m.__name__)
def test_ppo_advantages_update_and_metrics_on_the_gpu(module):
    """GAE and the minibatch update (statistics, forward, loss, backward, gradient sum and clipping) never wait for the
    GPU and mix no devices; the metrics (which read their values back) mix no devices either."""
    obs_shape = (3, 64, 64) if module is ppo_procgen else (4, 84, 84)
    agent = module.Agent(6, True).to(GPU)
    args = module.Args()
    rollout = [torch.zeros(5, 8, device=GPU) for _ in range(5)]  # rewards, values, terminations, truncations, valid
    minibatch = categorical_minibatch(obs_shape=obs_shape)
    extra = (agent.__class__(6, True).to(GPU).requires_grad_(False),) if module is ppo_ewma_atari else ()
    clip_coef = (torch.tensor(0.1, device=GPU),) if module is not ppo_procgen else ()  # the adapted clip is a tensor
    with HostSyncs() as syncs:
        module.compute_gae(*rollout, torch.zeros(8, device=GPU), 0.99, 0.95)
        statistics = module.minibatch_statistics(minibatch)
        stats = module.compute_gradients(agent, *extra, minibatch, statistics, args, *clip_coef)
        module.all_ranks_sum_gradients(agent.parameters())
        torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    assert syncs.calls == [] and set(stats) >= {"policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"}
    with HostSyncs():
        measured = module.measure_agent(agent, minibatch["obs"], minibatch["actions"], minibatch["logits"], 16, 0.025, *extra)
        metrics.gradient_kurtosis(p.grad for p in agent.parameters())
    assert {"feature_rank", "dormant_pct", "weight_norm", "ess_pct", "kl_behavior", "ddr"} <= set(measured)


def test_pqn_targets_update_and_metrics_on_the_gpu():
    q_network = pqn_atari.QNetwork(6).to(GPU)
    rollout = [torch.zeros(5, 8, device=GPU) for _ in range(5)]  # rewards, next max Q, terminations, truncations, valid
    minibatch = {
        "obs": torch.zeros(16, 4, 84, 84, dtype=torch.uint8, device=GPU),
        "actions": torch.zeros(16, dtype=torch.long, device=GPU),
        "targets": torch.zeros(16, device=GPU),
        "valid": torch.zeros(16, device=GPU),
    }
    with HostSyncs() as syncs:
        pqn_atari.compute_q_lambda_targets(*rollout, 0.99, 0.65)
        pqn_atari.compute_gradients(q_network, minibatch)
        torch.nn.utils.clip_grad_norm_(q_network.parameters(), 10.0)
    assert syncs.calls == []
    with HostSyncs():
        assert "q_mean" in pqn_atari.measure_q_network(q_network, minibatch["obs"], 0.025)


def test_rnd_advantages_update_and_metrics_on_the_gpu():
    agent, rnd = ppo_rnd_atari.Agent(6, False).to(GPU), ppo_rnd_atari.RNDModel().to(GPU)
    obs_rms = ppo_rnd_atari.RunningMeanStd(ppo_rnd_atari.FRAME_SHAPE).to(GPU)
    minibatch = categorical_minibatch() | {
        name: torch.zeros(16, device=GPU) for name in ("ext_values", "int_values", "ext_returns", "int_returns", "rnd_mask")
    }
    minibatch["next_frames"] = torch.zeros(16, *ppo_rnd_atari.FRAME_SHAPE, dtype=torch.uint8, device=GPU)
    rollout = [torch.zeros(5, 8, device=GPU) for _ in range(5)]
    with HostSyncs() as syncs:
        ppo_rnd_atari.compute_gae(*rollout, torch.zeros(8, device=GPU), 0.99, 0.95)
        ppo_rnd_atari.compute_intrinsic_gae(rollout[0], rollout[1], rollout[4], torch.zeros(8, device=GPU), 0.99, 0.95)
        statistics = ppo_rnd_atari.minibatch_statistics(minibatch) | {"rnd_count": minibatch["rnd_mask"].sum().clamp(min=1.0)}
        ppo_rnd_atari.compute_gradients(agent, rnd, obs_rms, minibatch, statistics, ppo_rnd_atari.Args())
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
    assert syncs.calls == []
    with HostSyncs():
        measured = ppo_rnd_atari.measure_agent(agent, minibatch["obs"], minibatch["actions"], minibatch["logits"], 16, 0.025)
    assert "feature_rank" in measured


def test_continuous_advantages_update_and_metrics_on_the_gpu():
    agent = ppo_isaacgym.Agent(obs_dim=5, action_dim=2, separate_networks=True).to(GPU)
    minibatch = {
        "obs": torch.zeros(16, 5, device=GPU),
        "actions": torch.zeros(16, 2, device=GPU),
        **{name: torch.zeros(16, device=GPU) for name in ("logprobs", "values", "advantages", "returns", "valid")},
    }
    with HostSyncs() as syncs:
        ppo_isaacgym.compute_gae(*(torch.zeros(5, 8, device=GPU) for _ in range(5)), torch.zeros(8, device=GPU), 0.99, 0.95)
        statistics = ppo_isaacgym.minibatch_statistics(minibatch)
        ppo_isaacgym.compute_gradients(agent, minibatch, statistics, ppo_isaacgym.Args())
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 1.0)
    assert syncs.calls == []
    means, stds = torch.zeros(16, 2, device=GPU), torch.ones(16, 2, device=GPU)
    with HostSyncs():
        measured = ppo_isaacgym.measure_agent(agent, minibatch["obs"], minibatch["actions"], means, stds, 16, 0.025)
    assert "policy_variance" in measured


# main() itself on the fake GPU (conftest.fake_cuda): 2 iterations of 2 envs x 4 steps. The fused Adam kernel refuses
# the fake GPU's tensors: --no-fused-adam (the update is not what these tests count).
FAKE_GPU_RUN = "--num-envs 2 --num-steps 4 --total-timesteps 16 --num-minibatches 2 --update-epochs 1 --no-fused-adam".split()
FAKE_GPU_STEPS = 2 * 4
FAKE_GPU_RUNS = {  # the flags of each run and what its step loop may wait for at each step
    "ppo_atari_envpool": ([], HOST_COPY),
    "ppo_ewma_atari": ([], HOST_COPY),
    "pqn_atari": ([], HOST_COPY),
    "ppo_rnd_atari": (["--num-iterations-obs-norm-init", "1"], HOST_COPY),  # the warm-up is not the step loop
    "ppo_procgen": ([], HOST_COPY),
    "ppo_isaacgym-envpool": (["--backend", "envpool", "--env-id", "Ant-v5"], HOST_COPY),  # EnvPoolTasks.step's
    "ppo_isaacgym-on-device": (["--backend", "envpool", "--env-id", "Ant-v5"], []),  # OnDeviceTasks: none
}


class OnDeviceTasks:
    """A simulator that steps on the training device, as Isaac Gym and MuJoCo Warp do: actions in, tensors out."""

    observation_space, action_space = gymnasium.spaces.Box(-1.0, 1.0, (5,)), gymnasium.spaces.Box(-1.0, 1.0, (2,))

    def __init__(self, args, num_envs: int, seed: int, device: torch.device):
        self.num_envs, self.device = num_envs, device

    def reset(self) -> torch.Tensor:
        return torch.zeros(self.num_envs, 5, device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ends = torch.zeros(self.num_envs, device=self.device)
        return actions.sum(-1, keepdim=True).expand(-1, 5), ends + 1.0, ends, ends


def fake_gpu_run(run, module, monkeypatch, tmp_path):
    """The script of FAKE_GPU_RUNS's `run` (`module`: it or a copy) run to the end on the fake GPU: the host-device
    synchronisations of its step loop."""
    if run == "ppo_isaacgym-on-device":
        monkeypatch.setattr(module, "make_tasks", OnDeviceTasks)
    argv = [*FAKE_GPU_RUN, *FAKE_GPU_RUNS[run][0], "--runs-dir", str(tmp_path / "runs")]
    syncs = step_loop_syncs(monkeypatch, module, argv)
    assert json.load(open(os.path.join(only_run_dir(tmp_path / "runs"), "done.json")))["iterations"] == 2
    return syncs


@pytest.mark.parametrize("run", list(FAKE_GPU_RUNS))
def test_main_step_loop_waits_for_the_gpu_as_its_comments_say(run, monkeypatch, tmp_path):
    """Each script's own main() on the fake GPU: its step loop (the lines of `for step in ...`, and what they call)
    waits for the GPU once a step, for the action copy that EnvPool needs ("the step's one sync"), or never where the
    simulator takes the actions on the device. The update and the logging, which read values back, are not counted."""
    module = importlib.import_module(run.split("-")[0])
    assert fake_gpu_run(run, module, monkeypatch, tmp_path) == FAKE_GPU_RUNS[run][1] * FAKE_GPU_STEPS


def script_copy(module, monkeypatch, tmp_path, line: str | None = None):
    """A copy of `module` loaded from tmp_path, with `line` added as the first statement of its step loop."""
    source = open(module.__file__).read().splitlines(keepends=True)
    if line is not None:
        body = step_loop_lines(module).start  # the 0-based index of the line after `for step in ...`
        source.insert(body, re.match(r" *", source[body])[0] + line + "\n")
    path = tmp_path / f"{module.__name__}_copy.py"
    path.write_text("".join(source))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, copy)  # as an import would: dataclasses look their module up there
    spec.loader.exec_module(copy)
    return copy


# A read of a value on the GPU added to a step loop, one way per script, and what HostSyncs calls it
ADDED_SYNCS = {
    "ppo_atari_envpool": ("next_obs.float().mean().item()", "_local_scalar_dense"),
    "ppo_ewma_atari": ("float(next_obs.float().mean())", "_local_scalar_dense"),
    "pqn_atari": ("bool(next_obs.any())", "_local_scalar_dense"),
    "ppo_rnd_atari": ("next_obs.flatten()[:3].tolist()", "copy to the host"),
    "ppo_procgen": ("int(next_obs.sum())", "_local_scalar_dense"),
    "ppo_isaacgym-envpool": ("next_obs.cpu()", "copy to the host"),
    "ppo_isaacgym-on-device": (None, "_local_scalar_dense"),  # in scale_rewards, a function the loop calls
}


@pytest.mark.parametrize("run", list(ADDED_SYNCS))
def test_a_sync_added_to_the_step_loop_of_main_is_counted(run, monkeypatch, tmp_path):
    """The check above on copies of the scripts with a read of a GPU value added to the step loop: it sees one more
    synchronisation per step, of that kind."""
    module, (line, kind) = importlib.import_module(run.split("-")[0]), ADDED_SYNCS[run]
    copy = script_copy(module, monkeypatch, tmp_path, line)
    if line is None:
        scale_rewards = copy.scale_rewards

        def read_then_scale(reward, *args):
            reward.sum().item()
            return scale_rewards(reward, *args)

        monkeypatch.setattr(copy, "scale_rewards", read_then_scale)
    syncs = fake_gpu_run(run, copy, monkeypatch, tmp_path)
    assert sorted(syncs) == sorted(FAKE_GPU_RUNS[run][1] * FAKE_GPU_STEPS + [kind] * FAKE_GPU_STEPS)


def test_feature_rank_is_given_no_tensor_of_another_device():
    """torch.searchsorted(values on the GPU, a CPU tensor) fails on CUDA (the meta kernels do not check it): every
    operation of feature_rank must see one device."""
    with HostSyncs():
        metrics.feature_rank(torch.zeros(32, 8, device=GPU))


def test_host_syncs_catches_what_cuda_would():
    """The checker itself: a mixed-device operation fails; reading a value, a host copy, a blocking copy to the GPU,
    boolean indexing and multinomial on the GPU are listed; the same on the CPU is not, nor a non-blocking copy."""
    on_gpu, on_host = torch.zeros(4, device=GPU), torch.zeros(4)
    with HostSyncs() as syncs, pytest.raises(AssertionError, match="mixes the devices"):
        torch.searchsorted(on_gpu, torch.tensor(0.5))
    with HostSyncs() as syncs:
        bool(on_gpu.sum() > 0), on_gpu.cpu(), torch.multinomial(on_gpu.softmax(0) + 1, 1)
        on_host.to(GPU), on_gpu.copy_(on_host), torch.as_tensor(np.zeros(4), device=GPU)
        on_host.to(GPU, non_blocking=True), on_gpu.copy_(on_host, non_blocking=True)
        torch.distributions.Categorical(logits=torch.zeros(2, 3)).sample()  # on the CPU: no GPU to wait for
    blocking_copies = ["blocking copy to the device"] * 3
    assert syncs.calls == ["_local_scalar_dense", "copy to the host", "multinomial", *blocking_copies]


@pytest.mark.parametrize("module", [ppo_atari_envpool, ppo_ewma_atari, ppo_procgen, ppo_rnd_atari], ids=lambda m: m.__name__)
def test_compiled_acting_is_one_graph_without_a_synchronising_operation(module):
    """--compile's acting graph: fullgraph=True fails on any read of a value (a graph break); the graph holds no
    operation that waits on CUDA (multinomial, nonzero)."""
    operations = []

    def record(graph_module, _example_inputs):
        operations.extend(str(node.target) for node in graph_module.graph.nodes if node.op in ("call_function", "call_method"))
        return graph_module.forward

    obs_shape = (3, 64, 64) if module is ppo_procgen else (4, 84, 84)
    agent = module.Agent(6, False)
    torch._dynamo.reset()
    torch.compile(agent.get_action_and_value, backend=record, fullgraph=True)(torch.zeros((8, *obs_shape), dtype=torch.uint8))
    assert operations and not [op for op in operations if re.search(r"\b(multinomial|nonzero|item|_local_scalar_dense)\b", op)]


def test_compiled_continuous_acting_draws_no_torch_normal():
    """--cudagraphs: Normal.sample's torch.normal(mean, std) stopped the CUDA graph's capture of ppo_isaacgym.py's acting
    ("operation not permitted when stream is capturing", seen on an H200); the action is mean + std * randn_like."""
    operations = []

    def record(graph_module, _example_inputs):
        operations.extend(str(node.target) for node in graph_module.graph.nodes if node.op in ("call_function", "call_method"))
        return graph_module.forward

    agent = ppo_isaacgym.Agent(obs_dim=5, action_dim=2, separate_networks=False)
    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(agent.get_action_and_value, backend=record, fullgraph=True)(torch.zeros(8, 5))
    assert any("randn_like" in op for op in operations) and not [op for op in operations if re.search(r"\bnormal\b", op)]


def test_sample_actions_draws_from_the_softmax():
    """Gumbel-max sampling: frequencies of 40,000 draws match softmax(logits) within 4 standard errors."""
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.5, 1e-9]]))
    torch.manual_seed(0)
    actions = ppo_atari_envpool.sample_actions(logits.repeat(20_000, 1)).view(20_000, 2)
    for row in range(2):
        frequencies = torch.bincount(actions[:, row], minlength=3).double() / 20_000
        expected = logits[row].softmax(0).double()
        assert torch.all((frequencies - expected).abs() <= 4 * (expected * (1 - expected) / 20_000).sqrt() + 1e-12)
    assert ppo_atari_envpool.sample_actions(torch.tensor([[0.0, -float("inf")]])).item() == 0  # impossible: never drawn


@pytest.mark.parametrize("module", [ppo_procgen, ppo_isaacgym, ppo_rnd_atari], ids=lambda m: m.__name__)
def test_running_statistics_change_in_place(module):
    """A compiled update that reads the statistics holds their addresses (CUDA graphs replay on them): an update
    writes into the same buffers."""
    rms = module.RunningMeanStd((3,))
    addresses = [buffer.data_ptr() for buffer in rms.buffers()]
    batch = torch.arange(12.0).view(4, 3)
    rms.update(batch, torch.ones(4))
    assert [buffer.data_ptr() for buffer in rms.buffers()] == addresses
    np.testing.assert_allclose(rms.mean.numpy(), batch.mean(0).numpy(), rtol=1e-4)


@pytest.mark.parametrize("module", [ppo_atari_envpool, ppo_procgen, ppo_isaacgym], ids=lambda m: m.__name__)
def test_collectives_per_minibatch_and_per_normaliser_update(module, monkeypatch):
    """Under torchrun: the minibatch statistics take one collective, the loss and backward none (a CUDA graph of the
    update would capture them), the gradients one flat buffer, a normaliser update one."""
    collectives = []
    monkeypatch.setattr(module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(module.dist, "all_reduce", lambda tensor: collectives.append(tuple(tensor.shape)))
    if module is ppo_isaacgym:
        agent, minibatch = module.Agent(5, 2, False), {"obs": torch.zeros(8, 5), "actions": torch.zeros(8, 2)}
    else:
        agent = module.Agent(6, False)
        minibatch = {
            "obs": torch.zeros((8, 3, 64, 64) if module is ppo_procgen else (8, 4, 84, 84), dtype=torch.uint8),
            "actions": torch.zeros(8, dtype=torch.long),
        }
    minibatch |= {name: torch.rand(8) for name in ("logprobs", "values", "advantages", "returns")} | {"valid": torch.ones(8)}
    statistics = module.minibatch_statistics(minibatch)
    assert collectives == [(3,)]
    extra = (torch.tensor(0.1),) if module is ppo_atari_envpool else ()
    module.compute_gradients(agent, minibatch, statistics, module.Args(), *extra)
    assert collectives == [(3,)]
    module.all_ranks_sum_gradients(agent.parameters())
    assert collectives[1:] == [(sum(p.numel() for p in agent.parameters()),)]
    if module is not ppo_atari_envpool:
        module.RunningMeanStd((5,)).update(torch.rand(8, 5), torch.ones(8))
        assert collectives[2:] == [(1 + 2 * 5,)]


@pytest.mark.parametrize(
    "module",
    [ppo_atari_envpool, ppo_ewma_atari, pqn_atari, ppo_rnd_atari, ppo_procgen, ppo_isaacgym],
    ids=lambda m: m.__name__,
)
def test_checkpoint_keeps_the_training_gpus_random_state_and_resumes_with_fewer_gpus(module, monkeypatch, tmp_path):
    """An 8-GPU checkpoint of an older version (every visible GPU's state) resumes on one GPU; a new checkpoint holds the
    training device's state only. CUDA's generator functions are stood in for: this machine may have no GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.full((16,), 7, dtype=torch.uint8))
    restored = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("would fail with fewer GPUs"))
    layer = torch.nn.Linear(2, 2)
    eight_gpus = [torch.full((16,), gpu, dtype=torch.uint8) for gpu in range(8)]
    checkpoint = {
        "model": layer.state_dict(),
        "iteration": 3,
        "global_step": 96,
        "rng": {"torch": torch.get_rng_state(), "cuda": eight_gpus},
    }
    assert module.restore_checkpoint(checkpoint, model=layer) == 96
    assert len(restored) == 1 and torch.equal(restored[0], eight_gpus[0])
    module.save_checkpoint(str(tmp_path), module.Args(), {"iteration": 1, "global_step": 32}, [], model=layer)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert len(saved["rng"]["cuda"]) == 1 and saved["rng"]["cuda"][0].tolist() == [7] * 16


ALL_SCRIPTS = [ppo_atari_envpool, ppo_ewma_atari, pqn_atari, ppo_rnd_atari, ppo_procgen, ppo_isaacgym]


@pytest.mark.parametrize("module", ALL_SCRIPTS, ids=lambda m: m.__name__)
def test_torch_takes_one_cpu_thread_on_a_gpu_unless_told(module, monkeypatch, tmp_path):
    """On a GPU torch's host work is copies, after which its idle OpenMP threads spin on the cores EnvPool steps on.
    A GPU is stood in for: this machine may have none."""
    threads, handlers = (
        torch.get_num_threads(),
        {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)},
    )
    try:
        for gpu, cuda, torch_threads, expected in (
            (True, True, None, 1),
            (True, True, 2, 2),
            (True, False, None, 3),
            (False, True, None, 3),
        ):
            monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
            monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Stand-in GPU")
            torch.set_num_threads(3)
            flags = module.Args(runs_dir=str(tmp_path), cuda=cuda, torch_threads=torch_threads)  # a run directory each
            run_dir, writer, progress, _ = module.start_run(module.validate_and_derive(flags), None)
            writer.close(), progress.close()
            assert torch.get_num_threads() == expected, (gpu, cuda, torch_threads)
            device = json.load(open(os.path.join(run_dir, "args.json")))["device"]  # what trained the run
            assert device == ("Stand-in GPU" if gpu and cuda else "cpu"), (gpu, cuda, device)
    finally:
        torch.set_num_threads(threads)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("script", ["pqn_atari.py", "ppo_rnd_atari.py"])
def test_single_process_scripts_refuse_torchrun_in_one_line(script, monkeypatch, capsys, tmp_path):
    module = {"pqn_atari.py": pqn_atari, "ppo_rnd_atari.py": ppo_rnd_atari}[script]
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it
    line = usage_error(module.main, monkeypatch, capsys, [script, "--runs-dir", str(tmp_path)])
    assert line == (
        f"error: {script} runs as one process: start it with python, not torchrun (which would run 2 identical "
        "copies); the PPO scripts without RND split one run over them"
    )
    assert not os.listdir(tmp_path)


# --------------------------------------------------------------------------------------
# On a GPU machine: the scripts end to end on CUDA
# --------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make test on a GPU machine runs it)")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (one per NCCL process)")
TINY = [
    "--num-envs",
    "4",
    "--num-steps",
    "16",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--total-timesteps",
    "256",
    "--metrics-interval",
    "2",
    "--metrics-batch",
    "24",
    "--checkpoint-interval",
    "2",
]
CUDA_RUNS = {
    "ppo_atari_envpool.py": [*TINY, "--max-episode-steps", "40"],
    "ppo_ewma_atari.py": [*TINY, "--max-episode-steps", "40"],
    "pqn_atari.py": [*TINY, "--max-episode-steps", "40"],
    "ppo_rnd_atari.py": [*TINY, "--max-episode-steps", "40", "--num-iterations-obs-norm-init", "1", "--env-id", "Breakout-v5"],
    "ppo_procgen.py": TINY,
    "ppo_isaacgym.py": [*TINY, "--backend", "envpool", "--env-id", "Ant-v5"],
}
TORCHRUN_SCRIPTS = ("ppo_atari_envpool.py", "ppo_ewma_atari.py", "ppo_procgen.py", "ppo_isaacgym.py")


# With --cudagraphs, a graph that inductor cannot capture is run without CUDA graphs, with a log line that is off by
# default: this makes it an error, so that the runs below show which operation stops the capture.
ALL_CAPTURED = {"TORCHINDUCTOR_CUDAGRAPH_OR_ERROR": "1"}


def check_cuda_run(result, runs_dir):
    assert result.returncode == 0, result.stderr
    assert "CUDA is not available" not in result.stdout
    run_dir = only_run_dir(runs_dir)
    scalars = read_scalars(run_dir)
    assert any(tag.startswith("losses/") for tag in scalars) and "metrics/weight_norm" in scalars, sorted(scalars)
    assert all(np.isfinite(value) for _, value in scalars["metrics/feature_rank"])  # the metrics ran on CUDA
    assert json.load(open(os.path.join(run_dir, "args.json")))["device"] == torch.cuda.get_device_name()
    return run_dir


@needs_cuda
@pytest.mark.parametrize("script", list(CUDA_RUNS))
@pytest.mark.parametrize(
    "speed",
    [[], ["--compile", "--cudagraphs"], ["--compile", "--cudagraphs", "--bf16"]],
    ids=["eager", "compile-cudagraphs", "compile-cudagraphs-bf16"],  # how to run
)
def test_script_trains_checkpoints_and_resumes_on_cuda(script, speed, tmp_path):
    flags = [*CUDA_RUNS[script], "--cuda", "--save-embeddings", *speed]  # the speed flags are given again on --resume
    run_dir = check_cuda_run(run_script(script, *flags, "--runs-dir", str(tmp_path), env=ALL_CAPTURED, cuda=True), tmp_path)
    assert len(np.load(os.path.join(run_dir, "embeddings.npz"))["features"]) > 0
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    assert json.load(open(os.path.join(run_dir, "done.json")))["global_step"] == 256
    # The finished run's budget doubled in its checkpoint: --resume loads the state onto the GPU and trains 4 more
    # iterations there (the optimizer's moments, the CUDA generator, the compiled graphs after a load)
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    checkpoint["args"]["total_timesteps"] = 512
    torch.save(checkpoint, checkpoint_path)
    os.remove(os.path.join(run_dir, "done.json"))  # not finished any more: --resume takes it
    resumed = run_script(script, "--resume", checkpoint_path, "--cuda", *speed, env=ALL_CAPTURED, cuda=True)
    assert resumed.returncode == 0 and "resumed at iteration 5" in resumed.stdout, resumed.stderr
    assert json.load(open(os.path.join(run_dir, "done.json")))["global_step"] == 512
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [64 * i for i in range(1, 9)]


@needs_cuda
@pytest.mark.skipif(importlib.util.find_spec("mujoco_warp") is None, reason="needs MuJoCo Warp (mujoco-warp, warp-lang)")
@pytest.mark.parametrize("speed", [[], ["--compile", "--cudagraphs"]], ids=["eager", "compile-cudagraphs"])
def test_mujoco_warp_backend_trains_on_cuda(speed, tmp_path):
    """ppo_isaacgym.py's GPU simulator: Warp's step as a CUDA graph on its own stream, torch's acting and update."""
    flags = [*TINY, "--backend", "mjwarp", "--env-id", "Ant", "--cuda", *speed, "--runs-dir", str(tmp_path)]
    run_dir = check_cuda_run(run_script("ppo_isaacgym.py", *flags, env=ALL_CAPTURED, cuda=True), tmp_path)
    assert json.load(open(os.path.join(run_dir, "args.json")))["backend"] == "mjwarp"


@needs_cuda
def test_a_phase_too_big_for_the_gpu_ends_the_run_with_one_line_naming_its_checkpoint(tmp_path):
    """Two iterations, then a --schedule phase of 8 envs x 10**9 steps of frames (210,285 GiB, more than any GPU):
    CUDA's OutOfMemoryError, read by stop_if_out_of_memory, names the checkpoint the first phase wrote as it ended
    (tests/test_faults.py checks the host's on the CPU)."""
    result = run_script("ppo_atari_envpool.py", *TOO_BIG_PHASE, "--cuda", "--runs-dir", str(tmp_path), cuda=True)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    checkpoint = os.path.join(only_run_dir(tmp_path), "checkpoint.pt")
    line = r"error: out of GPU memory \(tried to allocate 2102\d\d\.\d\d GiB\): try a smaller batch or minibatch; "
    assert len(errors) == 1 and (words := re.fullmatch(line + "or --resume (.+) with more memory free", errors[0])), errors
    assert words[1] == checkpoint and torch.load(checkpoint, weights_only=True)["global_step"] == 64


@needs_two_gpus
@pytest.mark.parametrize("script", TORCHRUN_SCRIPTS)
def test_two_nccl_processes_keep_identical_weights(script, tmp_path):
    result = run_torchrun(script, 2, *CUDA_RUNS[script], "--cuda", "--runs-dir", str(tmp_path), cuda=True)
    assert result.returncode == 0, result.stderr
    assert "weights identical on 2 of 2 processes" in result.stdout
    assert glob.glob(os.path.join(tmp_path, "*", "done.json"))
