"""Fake of IsaacGymEnvs 1.5.1's isaacgymenvs/tasks/base/vec_task.py: `Env` and `VecTask` without a simulator.

What it keeps of the real protocol, which the training script depends on:

- the buffers (`allocate_buffers`): `obs_buf` zeros, `rew_buf`, `reset_buf` ONES (every env starts "done", so the
  first `step()` resets every env), `timeout_buf`, `progress_buf` zeros (long tensors, on the sim device);
- `reset()` resets nothing: it returns `{"obs": obs_buf}` as it is (zeros before the first step, for most tasks: the
  real docstring says it "Doesn't calculate observations");
- `step(actions)`: clamp the actions to `clipActions`, `pre_physics_step`, simulate, `post_physics_step` (the task
  resets the envs whose `reset_buf` is set and computes observations, rewards and `reset_buf`), then
  `timeout_buf = (progress_buf >= max_episode_length - 1) & (reset_buf != 0)`, and return
  `({"obs": clamp(obs_buf, clipObservations)}, rew_buf, reset_buf, extras)` with `extras["time_outs"] = timeout_buf`
  (bool). The returned dict, `extras` and, on one device, `rew_buf` and `reset_buf` are the task's own buffers, written
  in place by the next step, as in the real one;
- `observation_space` (Box(-inf, inf, numObservations)) and `action_space` (Box(-1, 1, numActions)); the real ones are
  gym's Box, these gymnasium's (the same shape, low, high and float32 dtype);
- the device rule of `Env.__init__`: the GPU pipeline only with a cuda sim device, else the CPU (with the real notice).

Test instrumentation, not in the real VecTask: with FAKE_ISAACGYM_LEDGER=<path>, each step appends one JSON line with
each env's reward, done, time-out and whether the task reset it during this step (its action then moved the state that
the reset discarded).
"""

import json
import os
from abc import ABC, abstractmethod

import numpy as np
import torch
from gymnasium import spaces


class Env(ABC):
    def __init__(self, config: dict, rl_device: str, sim_device: str, graphics_device_id: int, headless: bool):
        device_type, _, device_id = sim_device.partition(":")
        self.device_type, self.device_id = device_type, int(device_id or 0)
        self.device = "cpu"
        if config["sim"]["use_gpu_pipeline"]:
            if self.device_type.lower() in ("cuda", "gpu"):
                self.device = f"cuda:{self.device_id}"
            else:
                print("GPU Pipeline can only be used with GPU simulation. Forcing CPU Pipeline.")
                config["sim"]["use_gpu_pipeline"] = False
        self.rl_device = rl_device
        self.headless = headless
        cameras = config["env"].get("enableCameraSensors", False)
        self.graphics_device_id = -1 if headless and not cameras else graphics_device_id
        self.num_environments = config["env"]["numEnvs"]
        self.num_observations = config["env"]["numObservations"]
        self.num_actions = config["env"]["numActions"]
        self.obs_space = spaces.Box(-np.inf, np.inf, (self.num_observations,), dtype=np.float32)
        self.act_space = spaces.Box(-1.0, 1.0, (self.num_actions,), dtype=np.float32)
        self.clip_obs = config["env"].get("clipObservations", np.inf)
        self.clip_actions = config["env"].get("clipActions", np.inf)
        self.control_steps = 0

    @property
    def observation_space(self):
        return self.obs_space

    @property
    def action_space(self):
        return self.act_space

    @property
    def num_envs(self) -> int:
        return self.num_environments

    @property
    def num_obs(self) -> int:
        return self.num_observations

    @property
    def num_acts(self) -> int:
        return self.num_actions

    @abstractmethod
    def allocate_buffers(self):
        """The tensors a step writes."""

    @abstractmethod
    def step(self, actions: torch.Tensor):
        """Observations, rewards, resets and extras after these actions."""

    @abstractmethod
    def reset(self):
        """The first observations."""


class VecTask(Env):
    def __init__(
        self, config, rl_device, sim_device, graphics_device_id, headless, virtual_screen_capture=False, force_render=False
    ):
        super().__init__(config, rl_device, sim_device, graphics_device_id, headless)
        self.force_render = force_render
        self.dt = config["sim"]["dt"]
        self.create_sim()
        self.allocate_buffers()
        self.obs_dict = {}
        self.ledger = os.environ.get("FAKE_ISAACGYM_LEDGER")

    def allocate_buffers(self):
        n, device = self.num_envs, self.device
        self.obs_buf = torch.zeros((n, self.num_obs), device=device, dtype=torch.float)
        self.rew_buf = torch.zeros(n, device=device, dtype=torch.float)
        self.reset_buf = torch.ones(n, device=device, dtype=torch.long)  # every env starts due for a reset
        self.timeout_buf = torch.zeros(n, device=device, dtype=torch.long)
        self.progress_buf = torch.zeros(n, device=device, dtype=torch.long)
        self.extras = {}
        self.reset_this_step = torch.zeros(n, device=device, dtype=torch.bool)  # the ledger's; set by the task's reset_idx

    @abstractmethod
    def create_sim(self):
        """The real one creates the Isaac Gym sim and the envs' actors; here: the task's state tensors."""

    @abstractmethod
    def pre_physics_step(self, actions: torch.Tensor):
        """Apply the actions."""

    @abstractmethod
    def simulate(self):
        """Stands for gym.simulate(sim) (controlFrequencyInv times) and fetch_results."""

    @abstractmethod
    def post_physics_step(self):
        """Reset the envs that need it, compute observations, rewards and reset_buf."""

    def step(self, actions: torch.Tensor):
        self.reset_this_step[:] = False
        self.pre_physics_step(torch.clamp(actions, -self.clip_actions, self.clip_actions))
        self.simulate()
        self.post_physics_step()
        self.control_steps += 1
        # A time-out is a reset at the time limit: the real rule, which also calls a termination on the last step one.
        self.timeout_buf = (self.progress_buf >= self.max_episode_length - 1) & (self.reset_buf != 0)
        self.extras["time_outs"] = self.timeout_buf.to(self.rl_device)
        self.obs_dict["obs"] = torch.clamp(self.obs_buf, -self.clip_obs, self.clip_obs).to(self.rl_device)
        if self.ledger:
            self.write_ledger()
        return self.obs_dict, self.rew_buf.to(self.rl_device), self.reset_buf.to(self.rl_device), self.extras

    def reset(self):
        """Called once at the start; computes nothing (as the real one): the first step() resets every env."""
        self.obs_dict["obs"] = torch.clamp(self.obs_buf, -self.clip_obs, self.clip_obs).to(self.rl_device)
        return self.obs_dict

    def reset_idx(self, env_ids: torch.Tensor):
        """Reset these envs' state; the tasks implement it."""

    def reset_done(self):
        """Reset the envs whose reset_buf is set now (rl_games' AMP agents call it; plain PPO only calls step)."""
        done_env_ids = self.reset_buf.nonzero(as_tuple=False).flatten()
        if len(done_env_ids) > 0:
            self.reset_idx(done_env_ids)
        self.obs_dict["obs"] = torch.clamp(self.obs_buf, -self.clip_obs, self.clip_obs).to(self.rl_device)
        return self.obs_dict, done_env_ids

    def zero_actions(self) -> torch.Tensor:
        return torch.zeros((self.num_envs, self.num_actions), dtype=torch.float32, device=self.rl_device)

    def write_ledger(self):
        columns = (self.rew_buf, self.reset_buf, self.timeout_buf, self.reset_this_step)
        line = dict(zip(("reward", "done", "time_out", "reset"), (c.tolist() for c in columns), strict=True))
        with open(self.ledger, "a") as ledger:
            ledger.write(json.dumps(line) + "\n")
