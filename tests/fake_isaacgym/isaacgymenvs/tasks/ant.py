"""Fake of IsaacGymEnvs 1.5.1's isaacgymenvs/tasks/ant.py (and humanoid.py, which works the same way): the order in
which a step resets, observes and rewards, with a walker of a few numbers instead of PhysX.

The real Ant's `post_physics_step`: `progress_buf += 1`; `reset_idx` for the envs whose `reset_buf` is set (those whose
episode ended on the PREVIOUS step: the reset comes one step late, and that step's action moved the state the reset
discards); then observations, then `compute_ant_reward`, which gives `deathCost` instead of the reward and sets
`reset_buf` where the torso is below `terminationHeight`, and sets `reset_buf` where
`progress_buf >= episodeLength - 1`. `reset_idx` draws reset noise from torch's global generator (`torch_rand_float`)
and sets `progress_buf` and `reset_buf` to 0. The observations end with the actions; the reward has an alive bonus
(0.5), a progress term and an action cost.

The fake walker: a height that starts at 1 and drops by `fall_rate` every step whatever the actions (env i falls at
0, 0.1, 0.2, 0.3 per step for i % 4 = 0, 1, 2, 3), a forward velocity equal to the mean action, and a position. So
after a reset, env i's episode ends at the first `progress_buf` p with 1 - p * fall_rate < 0.31, by termination (p = 7,
4, 3 for i % 4 = 1, 2, 3), or by time-out at p = episodeLength - 1 (i % 4 = 0): each cycle is that many steps plus
the reset step. Reward: 0.5 + velocity - 0.005 * sum(actions ** 2), deathCost when fallen. Observations: height,
velocity, position, progress / episodeLength, zeros, then the actions.
"""

import torch
from isaacgym import gymtorch  # noqa: F401 - as the real task module: the bindings, before torch

from .base.vec_task import VecTask


class Ant(VecTask):
    NUM_OBSERVATIONS, NUM_ACTIONS = 60, 8  # the real Ant's

    def __init__(self, cfg, rl_device, sim_device, graphics_device_id, headless, virtual_screen_capture, force_render):
        self.cfg = cfg
        self.max_episode_length = cfg["env"]["episodeLength"]
        self.termination_height = cfg["env"]["terminationHeight"]
        self.death_cost = cfg["env"]["deathCost"]
        cfg["env"]["numObservations"], cfg["env"]["numActions"] = self.NUM_OBSERVATIONS, self.NUM_ACTIONS
        super().__init__(
            config=cfg,
            rl_device=rl_device,
            sim_device=sim_device,
            graphics_device_id=graphics_device_id,
            headless=headless,
            virtual_screen_capture=virtual_screen_capture,
            force_render=force_render,
        )

    def create_sim(self):
        n = self.num_envs
        self.fall_rate = torch.tensor([0.0, 0.1, 0.2, 0.3], device=self.device).repeat(n // 4 + 1)[:n]
        self.height = torch.ones(n, device=self.device)  # the pose the sim starts in, before any reset
        self.velocity = torch.zeros(n, device=self.device)
        self.position = torch.zeros(n, device=self.device)
        self.actions = torch.zeros((n, self.NUM_ACTIONS), device=self.device)

    def pre_physics_step(self, actions):
        self.actions = actions.clone().to(self.device)

    def simulate(self):
        self.velocity = self.actions.mean(dim=-1)
        self.position += self.dt * self.velocity
        self.height -= self.fall_rate

    def post_physics_step(self):
        self.progress_buf += 1
        env_ids = self.reset_buf.nonzero(as_tuple=False).flatten()
        if len(env_ids) > 0:
            self.reset_idx(env_ids)
        self.compute_observations()
        self.compute_reward(self.actions)

    def reset_idx(self, env_ids):
        self.height[env_ids] = 1.0
        self.position[env_ids] = 0.0
        self.velocity[env_ids] = torch.rand(len(env_ids), device=self.device) * 0.2 - 0.1  # torch's global generator
        self.progress_buf[env_ids] = 0
        self.reset_buf[env_ids] = 0
        self.reset_this_step[env_ids] = True  # the ledger's (not in the real task)

    def compute_observations(self):
        self.obs_buf[:] = 0.0
        self.obs_buf[:, 0], self.obs_buf[:, 1], self.obs_buf[:, 2] = self.height, self.velocity, self.position
        self.obs_buf[:, 3] = self.progress_buf / self.max_episode_length
        self.obs_buf[:, -self.NUM_ACTIONS :] = self.actions

    def compute_reward(self, actions):
        reward = 0.5 + self.velocity - 0.005 * actions.square().sum(dim=-1)
        fallen = self.height < self.termination_height
        self.rew_buf[:] = torch.where(fallen, torch.full_like(reward, self.death_cost), reward)
        reset = torch.where(fallen, torch.ones_like(self.reset_buf), self.reset_buf)
        reset = torch.where(self.progress_buf >= self.max_episode_length - 1, torch.ones_like(self.reset_buf), reset)
        self.reset_buf[:] = reset


class Humanoid(Ant):
    """The real humanoid.py has Ant's step protocol with 108 observations and 21 actions."""

    NUM_OBSERVATIONS, NUM_ACTIONS = 108, 21
