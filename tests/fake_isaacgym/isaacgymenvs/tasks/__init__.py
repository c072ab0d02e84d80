"""Fake of IsaacGymEnvs' isaacgymenvs/tasks/__init__.py: the tasks' classes by name in `isaacgym_task_map` (the real
one has about 30; importing it imports every task module, and so Isaac Gym's bindings)."""

from .ant import Ant, Humanoid

# HumanoidAMP only by name: the script refuses it before making it (its resets follow another protocol)
isaacgym_task_map = {"Ant": Ant, "Humanoid": Humanoid, "HumanoidAMP": Humanoid}
