"""Fake of IsaacGymEnvs 1.5.1's isaacgymenvs/__init__.py: `make()`, its signature and what it does with each argument.

The real `make` composes the task's Hydra config (isaacgymenvs/cfg/task/<task>.yaml), sets its `env.numEnvs`, and
creates `isaacgym_task_map[name](cfg=..., rl_device=..., sim_device=..., graphics_device_id=..., headless=...,
virtual_screen_capture=..., force_render=...)` through isaacgymenvs/utils/rlgames_utils.py's
`get_rlgames_env_creator`, which returns the task itself (a VecTask), not a wrapper. Like the real one, this `make`
accepts `seed` and never uses it: `get_rlgames_env_creator` takes it and drops it (train.py seeds with
utils.utils.set_seed instead), so the tasks' reset noise comes from torch's global generator, which the caller seeds.
"""

import copy
import os

# The tasks' configs (the real ones are Hydra YAML files): the keys VecTask and the fake tasks read. The episodes are
# short (the real Ant and Humanoid have episodeLength 1000) so that a tiny run sees terminations and time-outs.
TASK_CONFIGS = {
    "Ant": {
        "name": "Ant",
        "physics_engine": "physx",
        "env": {"numEnvs": 4096, "episodeLength": 12, "clipActions": 1.0, "terminationHeight": 0.31, "deathCost": -2.0},
        "sim": {"dt": 0.0166, "use_gpu_pipeline": True},
    },
    "Humanoid": {
        "name": "Humanoid",
        "physics_engine": "physx",
        "env": {"numEnvs": 4096, "episodeLength": 12, "clipActions": 1.0, "terminationHeight": 0.31, "deathCost": -1.0},
        "sim": {"dt": 0.0166, "use_gpu_pipeline": True},
    },
}


def make(
    seed: int,
    task: str,
    num_envs: int,
    sim_device: str,
    rl_device: str,
    graphics_device_id: int = -1,
    headless: bool = False,
    multi_gpu: bool = False,
    virtual_screen_capture: bool = False,
    force_render: bool = True,
    cfg: dict | None = None,
):
    """The task's vectorised env (a VecTask). `seed` is unused, as in IsaacGymEnvs (see the module's docstring)."""
    from isaacgymenvs.tasks import isaacgym_task_map

    if cfg is None:
        if task not in TASK_CONFIGS:  # the real one fails in Hydra: "In 'config': Could not find 'task/<task>'"
            raise ValueError(f"In 'config': Could not find 'task/{task}'")
        cfg = copy.deepcopy(TASK_CONFIGS[task])
        cfg["env"]["numEnvs"] = num_envs
    if multi_gpu:  # as get_rlgames_env_creator: each torchrun process simulates on its own GPU
        sim_device = rl_device = f"cuda:{int(os.getenv('LOCAL_RANK', '0'))}"
    return isaacgym_task_map[cfg["name"]](
        cfg=cfg,
        rl_device=rl_device,
        sim_device=sim_device,
        graphics_device_id=graphics_device_id,
        headless=headless,
        virtual_screen_capture=virtual_screen_capture,
        force_render=force_render,
    )
