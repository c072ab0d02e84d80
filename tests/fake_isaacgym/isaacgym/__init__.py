"""Fake Isaac Gym (Preview 4) package for the tests: `import isaacgym` loads the bindings (gymapi), which refuse to load
once torch is imported. The real package must do the same for the idiom of IsaacGymEnvs' README (`import isaacgym`, then
torch, then the tasks, whose modules import gymapi and gymtorch) to work; ppo_isaacgym.py's first lines rely on it."""

from isaacgym import gymapi  # noqa: F401 - the bindings load with the package, so their torch check runs here
