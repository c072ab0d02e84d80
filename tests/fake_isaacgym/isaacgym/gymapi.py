"""Fake of Isaac Gym's gymapi (the native bindings' wrapper): only its import of gymdeps, and the physics engine names
that VecTask reads from a task's config. No simulator: the fake tasks integrate their own state in torch."""

from isaacgym import gymdeps  # noqa: F401 - the torch check

SIM_PHYSX, SIM_FLEX = 0, 1
