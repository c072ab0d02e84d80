"""Fake of Isaac Gym's gymtorch (the bridge between the simulator's buffers and torch tensors): it needs gymapi, so
importing it after torch fails as the real one does (IsaacGymEnvs' tasks import it at the top)."""

from isaacgym import gymapi  # noqa: F401
