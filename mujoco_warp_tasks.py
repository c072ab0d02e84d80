"""Gymnasium v5's Ant and Humanoid on MuJoCo Warp: N worlds stepped together, torch tensors on the training device.

    envs = WarpTasks("Ant", num_envs=4096, seed=1, device=torch.device("cuda"))
    obs = envs.reset()
    obs, rewards, terminations, truncations = envs.step(actions)

The simulator adapter of `ppo_isaacgym.py --backend mjwarp` (MuJoCo Warp, `mujoco-warp`, by Google DeepMind and
NVIDIA: MuJoCo's pipeline as Warp kernels, on a GPU or on the CPU). The tasks are Gymnasium's `Ant-v5` and
`Humanoid-v5`, written again for a batch of worlds from their definitions (gymnasium/envs/mujoco/ant_v5.py and
humanoid_v5.py): the same XML files (shipped inside gymnasium), frame skip 5, observation, reward terms, healthy-z
termination, reset noise and 1000-step time limit. Two changes, both forced by MuJoCo Warp:
- Humanoid's XML asks for MuJoCo's PGS solver, which MuJoCo Warp does not have: it runs Newton's solver instead.
- MuJoCo Warp computes in float32, MuJoCo in float64.
`tests/test_mujoco_warp_tasks.py` puts Gymnasium's environments and these in the same states, applies the same
actions and compares what they return.

As EnvPool does, a world whose episode ended is reset on its next step: that step ignores the action and returns
the first observation of the new episode with reward 0 (the training script masks it out), so that the step that
ended the episode returns the real last observation, from which a truncation bootstraps. A world whose state went NaN
or inf (an unstable simulation) terminates with a last observation and reward of 0. Everything stays on the device;
there is no loop over worlds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import gymnasium
import mujoco
import mujoco_warp as mjw
import numpy as np
import torch
import warp as wp

wp.config.log_level = wp.LOG_ERROR  # no greeting and no line per compiled module; Warp's errors still print


@dataclass(frozen=True)
class Task:
    """One of Gymnasium's v5 locomotion tasks: the constructor defaults of its environment class."""

    xml_file: str
    forward_reward_weight: float
    ctrl_cost_weight: float
    contact_cost_weight: float
    healthy_reward: float
    healthy_z_range: tuple[float, float]
    reset_noise_scale: float
    frame_skip: int = 5
    max_episode_steps: int = 1000  # gymnasium.envs.registration: both register with max_episode_steps=1000


TASKS = {
    "Ant": Task(
        "ant.xml",
        forward_reward_weight=1.0,
        ctrl_cost_weight=0.5,
        contact_cost_weight=5e-4,
        healthy_reward=1.0,
        healthy_z_range=(0.2, 1.0),
        reset_noise_scale=0.1,
    ),
    "Humanoid": Task(
        "humanoid.xml",
        forward_reward_weight=1.25,
        ctrl_cost_weight=0.1,
        contact_cost_weight=5e-7,
        healthy_reward=5.0,
        healthy_z_range=(1.0, 2.0),
        reset_noise_scale=1e-2,
    ),
}
ANT_CONTACT_FORCE_RANGE = (-1.0, 1.0)  # Ant clips the external forces in its observation and contact cost
HUMANOID_MAX_CONTACT_COST = 10.0


def load_model(name: str) -> mujoco.MjModel:
    """The task's MuJoCo model from the XML file that Gymnasium ships, with Newton's solver for Humanoid."""
    path = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", TASKS[name].xml_file)
    model = mujoco.MjModel.from_xml_path(path)
    model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON  # humanoid.xml asks for PGS, which MuJoCo Warp lacks
    return model


class WarpTasks:
    """`num_envs` worlds of one task on MuJoCo Warp; observations, rewards, terminations and truncations are float32
    torch tensors on `device` (zero-copy views of Warp's arrays where they can be)."""

    def __init__(self, name: str, num_envs: int, seed: int, device: torch.device, max_episode_steps: int | None = None):
        self.name, self.task, self.device = name, TASKS[name], device
        self.max_episode_steps = max_episode_steps or self.task.max_episode_steps
        self.mj_model = load_model(name)
        self.warp_device = wp.get_device(str(device) if device.type == "cuda" else "cpu")
        with wp.ScopedDevice(self.warp_device):
            self.model = mjw.put_model(self.mj_model)
            self.data = mjw.make_data(self.mj_model, nworld=num_envs)
        # Views of Warp's state: writing into them writes the simulator's state.
        self.qpos, self.qvel, self.ctrl = (wp.to_torch(array) for array in (self.data.qpos, self.data.qvel, self.data.ctrl))
        self.xpos, self.xipos, self.cfrc_ext = (
            wp.to_torch(array) for array in (self.data.xpos, self.data.xipos, self.data.cfrc_ext)
        )
        self.cinert, self.cvel = wp.to_torch(self.data.cinert), wp.to_torch(self.data.cvel)
        self.qfrc_actuator = wp.to_torch(self.data.qfrc_actuator)
        self.init_qpos = torch.as_tensor(self.mj_model.qpos0, dtype=torch.float32, device=device)
        self.body_mass = torch.as_tensor(self.mj_model.body_mass, dtype=torch.float32, device=device)
        self.dt = self.mj_model.opt.timestep * self.task.frame_skip
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.elapsed = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.ended = torch.zeros(num_envs, dtype=torch.bool, device=device)  # reset on the next step
        self.position_before = torch.zeros(num_envs, 2, device=device)
        low, high = self.mj_model.actuator_ctrlrange.T.astype(np.float32)
        self.action_space = gymnasium.spaces.Box(low, high, dtype=np.float32)
        obs_dim = self.observation(torch.zeros(num_envs, dtype=torch.bool, device=device)).shape[1]
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (obs_dim,), dtype=np.float32)
        # On a GPU, Warp works on its own stream (a CUDA graph cannot be captured on the legacy default stream that torch
        # uses), ordered after torch's work and before torch reads the results. Its work is replayed as graphs, one for
        # the physics of a step, one for the reset and one for the forward pass: called eagerly on a GPU, the constraint
        # solver's loop (wp.capture_while) would read its condition back to the host at every iteration.
        self.stream = wp.get_stream(self.warp_device) if self.warp_device.is_cuda else None
        self.graphs = {}
        self.reset_mask = torch.zeros(num_envs, dtype=torch.bool, device=device)  # the reset graph reads it at its address
        self.reset_mask_warp = wp.from_torch(self.reset_mask)

    # ---- Gymnasium's definitions, for every world at once ----
    def position(self) -> torch.Tensor:
        """(N, 2): Ant's torso x, y (body 1); Humanoid's centre of mass (gymnasium's mass_center)."""
        if self.name == "Ant":
            return self.xpos[:, 1, :2]
        return (self.body_mass[None, :, None] * self.xipos).sum(1)[:, :2] / self.body_mass.sum()

    def contact_forces(self) -> torch.Tensor:
        """(N, nbody - 1, 6) external forces on the bodies (the world body left out), clipped for Ant."""
        forces = self.cfrc_ext[:, 1:]
        return forces.clamp(*ANT_CONTACT_FORCE_RANGE) if self.name == "Ant" else forces

    def observation(self, reset: torch.Tensor) -> torch.Tensor:
        """(N, obs_dim). Worlds just reset have no contact forces yet (MuJoCo's reset zeroes them, and its forward
        pass does not compute them): 0, even where the last step left a NaN."""
        contact = torch.where(reset[:, None, None], 0.0, self.contact_forces())
        parts = [self.qpos[:, 2:], self.qvel]
        if self.name == "Humanoid":
            parts += [self.cinert[:, 1:].flatten(1), self.cvel[:, 1:].flatten(1), self.qfrc_actuator[:, 6:]]
        return torch.cat([*parts, contact.flatten(1)], dim=1)

    def healthy(self) -> torch.Tensor:
        low, high = self.task.healthy_z_range
        z = self.qpos[:, 2]
        if self.name == "Ant":  # a finite state with low <= z <= high
            finite = torch.isfinite(self.qpos).all(1) & torch.isfinite(self.qvel).all(1)
            return finite & (z >= low) & (z <= high)
        return (z > low) & (z < high)

    def reward(self, x_velocity: torch.Tensor, actions: torch.Tensor, healthy: torch.Tensor) -> torch.Tensor:
        """forward + healthy - control cost - contact cost."""
        task = self.task
        control_cost = task.ctrl_cost_weight * actions.square().sum(1)
        contact_cost = task.contact_cost_weight * self.contact_forces().square().sum((1, 2))
        if self.name == "Humanoid":
            contact_cost = contact_cost.clamp(max=HUMANOID_MAX_CONTACT_COST)
        return task.forward_reward_weight * x_velocity + task.healthy_reward * healthy - control_cost - contact_cost

    # ---- The environment ----
    def reset(self) -> torch.Tensor:
        """Every world starts a new episode; their first observations."""
        everything = torch.ones_like(self.ended)
        self.reset_worlds(everything)
        self.ended.zero_()
        return self.observation(everything)

    def reset_worlds(self, reset: torch.Tensor) -> None:
        """MuJoCo's reset of the `reset` worlds (zeroed data, qpos0), then Gymnasium's noise: qpos + U(-s, s); qvel +
        s * N(0, 1) for Ant, U(-s, s) for Humanoid. The forward pass computes what the first observation reads."""
        scale, (num_envs, nq), nv = self.task.reset_noise_scale, self.qpos.shape, self.qvel.shape[1]
        self.reset_mask.copy_(reset)
        self.on_warp("reset", lambda: mjw.reset_data(self.model, self.data, reset=self.reset_mask_warp))
        qpos_noise = torch.rand(num_envs, nq, generator=self.generator, device=self.device) * 2 * scale - scale
        if self.name == "Ant":
            qvel_noise = torch.randn(num_envs, nv, generator=self.generator, device=self.device) * scale
        else:
            qvel_noise = torch.rand(num_envs, nv, generator=self.generator, device=self.device) * 2 * scale - scale
        self.qpos.copy_(torch.where(reset[:, None], self.init_qpos + qpos_noise, self.qpos))
        self.qvel.copy_(torch.where(reset[:, None], qvel_noise, self.qvel))
        self.forward(reset)

    def set_state(self, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        """Put every world in the given state, as Gymnasium's set_state does (for tests); their observations."""
        everything = torch.ones_like(self.ended)
        self.reset_mask.fill_(True)
        self.on_warp("reset", lambda: mjw.reset_data(self.model, self.data, reset=self.reset_mask_warp))
        self.qpos.copy_(qpos)
        self.qvel.copy_(qvel)
        self.forward(everything)
        self.ended.zero_()
        return self.observation(everything)

    def forward(self, reset: torch.Tensor) -> None:
        """MuJoCo's forward pass for the positions and velocities just written; the episode counters of the reset
        worlds restart. Every world's positions and velocities are recomputed from its state, so the position that
        the next step's velocity starts from is taken here for the reset worlds only (the others keep the one of
        their last step, as Gymnasium reads it)."""
        self.on_warp("forward", lambda: mjw.forward(self.model, self.data))
        self.position_before.copy_(torch.where(reset[:, None], self.position(), self.position_before))
        self.elapsed.mul_(~reset)

    def on_warp(self, name: str, kernels) -> None:
        """Run Warp's work (`kernels()`) as the graph `name`, recorded at its first call (its arrays keep their addresses,
        so each replay reads their new values): on a GPU a CUDA graph on Warp's stream, after torch's work and before
        torch reads the results; on the CPU Warp's own graph of the same launches, so that both run the same code."""
        if self.stream is not None:
            torch_stream = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(wp.stream_from_torch(torch_stream))
        with wp.ScopedStream(self.stream):  # also Warp's default device for the kernels (a torchrun process's own GPU)
            if name not in self.graphs:
                with wp.ScopedCapture(device=self.warp_device, stream=self.stream) as capture:
                    kernels()
                self.graphs[name] = capture.graph
            wp.capture_launch(self.graphs[name], stream=self.stream)
        if self.stream is not None:
            torch_stream.wait_stream(wp.stream_to_torch(self.stream))

    def physics(self) -> None:
        """frame_skip steps of every world, then the external forces on the bodies (Gymnasium calls
        mj_rnePostConstraint after stepping: mj_step leaves cfrc_ext out)."""
        for _ in range(self.task.frame_skip):
            mjw.step(self.model, self.data)
        mjw.rne_postconstraint(self.model, self.data)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Next observations, rewards, terminations and truncations, (N, obs_dim) and (N,) each, float32."""
        restarting = self.ended.clone()  # the worlds that ended at the last step begin a new episode now
        self.ctrl.copy_(actions)
        self.on_warp("physics", self.physics)
        position_after = self.position()
        x_velocity = (position_after[:, 0] - self.position_before[:, 0]) / self.dt
        healthy = self.healthy()
        obs = self.observation(torch.zeros_like(restarting))
        rewards = self.reward(x_velocity, actions, healthy)
        # An unstable world (NaN or inf in its state; MuJoCo C would reset it, MuJoCo Warp does not) terminates, and its
        # last observation and reward read 0: nothing bootstraps from them, and a NaN would reach the normalisers
        unstable = ~(obs.isfinite().all(1) & rewards.isfinite())
        obs, rewards = torch.where(unstable[:, None], 0.0, obs), torch.where(unstable, 0.0, rewards)
        terminations = ~healthy | unstable
        self.elapsed += 1
        truncations = self.elapsed >= self.max_episode_steps
        self.position_before.copy_(position_after)
        # The worlds that ended at the last step: a new episode, its first observation, reward 0, not ended.
        self.reset_worlds(restarting)
        obs = torch.where(restarting[:, None], self.observation(restarting), obs)
        rewards = torch.where(restarting, 0.0, rewards)  # 0 even after a NaN state (an unstable world terminates)
        terminations, truncations = terminations & ~restarting, truncations & ~restarting
        self.ended.copy_(terminations | truncations)
        return obs, rewards, terminations.float(), truncations.float()
