"""The simulators of `ppo_isaacgym.py`, each seen as Isaac Gym's tasks: a batch of envs, float32 tensors on the device.

    envs = make_tasks(args, num_envs=4096, seed=1, device=torch.device("cuda"))
    obs = envs.reset()
    obs, rewards, terminations, truncations = envs.step(actions)

Isaac Gym (IsaacGymEnvs' tasks, when installed), MuJoCo Warp (`mujoco_warp_tasks.WarpTasks`: Gymnasium's Ant and
Humanoid, on a GPU or the CPU) and EnvPool's MuJoCo tasks (on the CPU). Each resets an env on the step after its
episode ended, as EnvPool does: the training script masks that step out. `choose_simulator` picks the simulator of
`--backend auto` and says, before anything is created, what keeps the chosen one from running the task.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings

import envpool
import numpy as np
import torch

MJWARP_TASKS = ("Ant", "Humanoid")  # mujoco_warp_tasks.TASKS, named here without importing Warp


def choose_simulator(args, gpu: bool) -> str | None:  # noqa: PLR0911 - one return per check, in order
    """Set args.backend (auto: Isaac Gym if installed and it has the task, else MuJoCo Warp on a GPU for Ant and
    Humanoid, else EnvPool) and args.env_id (the task's name there); return what keeps them from running (gpu: on the
    GPU), or None."""
    isaacgym = all(importlib.util.find_spec(name) for name in ("isaacgym", "isaacgymenvs"))
    mjwarp = all(importlib.util.find_spec(name) for name in ("mujoco_warp", "warp"))
    tasks = importlib.import_module("isaacgymenvs.tasks").isaacgym_task_map if isaacgym and args.backend != "envpool" else {}
    # Ant and Humanoid name the same task on every simulator, so that one sweep runs anywhere: Isaac Gym's tasks, and
    # Gymnasium's Ant-v5 and Humanoid-v5 on MuJoCo Warp and EnvPool.
    task = args.env_id.removesuffix("-v5") if args.env_id in ("Ant-v5", "Humanoid-v5") else args.env_id
    if args.backend == "auto":  # MuJoCo Warp on a CPU is far slower than EnvPool
        auto_warp = mjwarp and gpu and task in MJWARP_TASKS and warp_gpu_problem() is None
        args.backend = "isaacgym" if task in tasks else "mjwarp" if auto_warp else "envpool"
    args.env_id = task if args.backend != "envpool" else {"Ant": "Ant-v5", "Humanoid": "Humanoid-v5"}.get(task, task)
    if args.backend == "isaacgym" and not isaacgym:
        return (
            "--backend isaacgym: Isaac Gym is not installed (it is not on PyPI): download Isaac Gym Preview 4 from "
            "https://developer.nvidia.com/isaac-gym, `pip install -e isaacgym/python`, then `pip install -e .` in a clone "
            "of https://github.com/isaac-sim/IsaacGymEnvs; or run the MuJoCo counterpart with --backend envpool"
        )
    if args.backend == "isaacgym" and args.env_id not in tasks:
        return f"--env-id {args.env_id!r} is not an Isaac Gym task (known: {', '.join(sorted(tasks))})"
    if args.backend == "isaacgym" and args.env_id.startswith(("AnymalTerrain", "HumanoidAMP")):
        # AnymalTerrain resets an env on the step its episode ends (and never reports a time-out); HumanoidAMP resets
        # only through reset_done(): neither follows the reset-on-the-next-step protocol that the script masks
        return f"--env-id {args.env_id}: its resets do not follow IsaacGymEnvs' VecTask protocol, which ppo_isaacgym.py needs"
    if args.backend == "isaacgym" and args.max_episode_steps is not None:
        return "--max-episode-steps applies to --backend envpool and mjwarp (Isaac Gym tasks set their own episode length)"
    if args.backend == "mjwarp" and not mjwarp:
        return (
            "--backend mjwarp: MuJoCo Warp is not installed: pip install mujoco-warp==4.0.0 warp-lang==1.19.0 (or make setup)"
        )
    if args.backend == "mjwarp" and args.env_id not in MJWARP_TASKS:
        return f"--env-id {args.env_id!r} is not a MuJoCo Warp task (known: {', '.join(MJWARP_TASKS)})"
    if args.backend == "envpool" and envpool.registration.registry.specs.get(args.env_id, ("",))[0] != "envpool.mujoco.gym":
        return (
            f"--env-id {args.env_id!r} is not an EnvPool MuJoCo task (e.g. Ant-v5, Humanoid-v5, HalfCheetah-v5, Hopper-v5, "
            f"Walker2d-v5){'' if isaacgym else '; Isaac Gym tasks need Isaac Gym installed'}"
        )
    return warp_gpu_problem() if args.backend == "mjwarp" and gpu else None  # e.g. an old NVIDIA driver


def make_tasks(args, num_envs: int, seed: int, device: torch.device):
    """This process's envs on the simulator of --backend (Isaac Gym, MuJoCo Warp or EnvPool)."""
    if args.backend == "mjwarp":  # the project's adapter for Gymnasium's tasks on MuJoCo Warp; it imports Warp
        from mujoco_warp_tasks import WarpTasks  # noqa: PLC0415

        return WarpTasks(args.env_id, num_envs, seed, device, args.max_episode_steps)
    return (IsaacGymTasks if args.backend == "isaacgym" else EnvPoolTasks)(args, num_envs, seed, device)


def warp_gpu_problem() -> str | None:
    """Why Warp cannot run on the GPU that torch sees (e.g. an NVIDIA driver older than warp-lang 1.19 needs), or None."""
    import warp as wp  # noqa: PLC0415 - only for --backend mjwarp

    wp.config.log_level = wp.LOG_ERROR  # no greeting; Warp's own errors still print
    wp.init()
    if wp.is_cuda_available():
        return None
    driver = "not found" if (version := wp.get_cuda_driver_version()) is None else version
    return (
        f"--backend mjwarp: Warp {wp.config.version} cannot use the GPU that torch sees (CUDA driver: {driver}; warp-lang "
        "1.18 and newer need NVIDIA driver R580 or newer): update the driver, or train with --no-cuda or --backend envpool"
    )


def video_env(args):
    """Gymnasium's MuJoCo v5 task of the run (the model that --backend envpool's -v5 ids and mjwarp simulate), rendering
    RGB frames: headless through EGL (a GPU driver's or Mesa's) unless MUJOCO_GL names another OpenGL."""
    import gymnasium  # noqa: PLC0415 - only for --capture-video

    os.environ.setdefault("MUJOCO_GL", "egl")  # read when the first frame is rendered
    task = args.env_id if args.backend == "envpool" else f"{args.env_id}-v5"
    # The model's "track" camera follows the robot; Gymnasium 1.4's default camera stays put, and a robot that runs
    # leaves the picture within seconds (a model without that camera, say Reacher's, keeps the default).
    return gymnasium.make(task, render_mode="rgb_array", camera_name="track", max_episode_steps=args.max_episode_steps)


def video_problem(args) -> str | None:
    """What keeps --capture-video from rendering the run's task here, found by rendering one frame; or None."""
    if args.backend == "isaacgym" or (args.backend == "envpool" and not args.env_id.endswith("-v5")):
        return (
            f"--capture-video renders Gymnasium's MuJoCo v5 tasks (on envpool or mjwarp), not {args.env_id} on {args.backend}"
        )
    try:
        with warnings.catch_warnings(action="ignore"):  # GLFW warns at each step that fails before it raises: one line
            env = video_env(args)
            env.reset(seed=0)
            env.render()
            env.close()
    except Exception as error:  # noqa: BLE001 - no OpenGL: MuJoCo's, PyOpenGL's or EGL's own errors
        reason, gl = " ".join(str(error).split()), os.environ["MUJOCO_GL"]
        return f"--capture-video: MuJoCo cannot render with MUJOCO_GL={gl} ({reason}); egl needs libEGL, osmesa libOSMesa"
    return None


class EnvPoolTasks:
    """EnvPool's MuJoCo tasks on the CPU, seen as Isaac Gym's: float32 tensors on the training device."""

    def __init__(self, args, num_envs: int, seed: int, device: torch.device):
        time_limit = {} if args.max_episode_steps is None else {"max_episode_steps": args.max_episode_steps}
        self.envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **time_limit)
        self.observation_space, self.action_space, self.device = self.envs.observation_space, self.envs.action_space, device
        # a step's observations, rewards, terminations and truncations side by side, copied to the device together
        self.staging = torch.empty(num_envs, self.observation_space.shape[0] + 3, pin_memory=device.type == "cuda")

    def reset(self) -> torch.Tensor:
        return torch.as_tensor(self.envs.reset()[0], dtype=torch.float32, device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Next observations, rewards, terminations, truncations. On CUDA, one copy to the GPU from page-locked memory,
        which does not wait for the GPU (the action copy has: the buffer is free again)."""
        step = np.column_stack(self.envs.step(actions.cpu().numpy())[:4]).astype(np.float32)  # obs | reward | term | trunc
        self.staging.copy_(torch.from_numpy(step))
        moved = self.staging.to(self.device, non_blocking=True, copy=True)
        return moved[:, :-3], *moved[:, -3:].T


class IsaacGymTasks:
    """IsaacGymEnvs' tasks: observations and rewards stay tensors on the training device (tested on tests/fake_isaacgym).
    Under torchrun, each process simulates its share of the envs on its own GPU (cuda:LOCAL_RANK). Isaac Gym loads only
    before torch: ppo_isaacgym.py imports it first."""

    def __init__(self, args, num_envs: int, seed: int, device: torch.device):
        import isaacgymenvs  # noqa: PLC0415 - only with Isaac Gym

        sim_device, graphics_device = (str(device), device.index) if device.type == "cuda" else ("cpu", -1)
        devices = dict(sim_device=sim_device, rl_device=str(device), graphics_device_id=graphics_device)
        self.envs = isaacgymenvs.make(seed=seed, task=args.env_id, num_envs=num_envs, headless=True, **devices)
        self.observation_space, self.action_space = self.envs.observation_space, self.envs.action_space

    def reset(self) -> torch.Tensor:
        """The first observations. IsaacGymEnvs' VecTask starts with every env flagged for reset and its reset() computes
        nothing, so its first step() resets them all (the action is ignored): taken here, the script's first step is real."""
        self.envs.reset()
        return self.envs.step(self.envs.zero_actions())[0]["obs"].float()

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        obs, reward, dones, extras = self.envs.step(actions)
        truncated = extras["time_outs"].float()  # time-limit resets; the other dones are terminations
        return obs["obs"].float(), reward.float(), dones.float() * (1.0 - truncated), truncated
