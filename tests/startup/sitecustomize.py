"""Loaded at the start of every Python process the tests launch (conftest.py puts this folder on their PYTHONPATH).

`import envpool` registers all of EnvPool's task families, and Jumanji's and PGX's registrations alone import JAX and
matplotlib: about 1.3 s of CPU of the 4-5 s that each script's imports take, in the 100-odd processes of the suite. No
script of the project uses those families (Atari, Procgen and MuJoCo's Gymnasium tasks only), so their registration
modules are left out here. The pytest process itself registers every family (the in-process tests of the scripts'
task checks see EnvPool as a user does). TESTS_FULL_ENVPOOL=1 turns this off."""

import os
import sys
import types

if os.environ.get("TESTS_FULL_ENVPOOL") != "1":
    for family in (
        "box2d",
        "classic_control",
        "gfootball",
        "highway",
        "jumanji",
        "minigrid",
        "mujoco.dmc",
        "mujoco.metaworld",
        "mujoco.myosuite",
        "mujoco.playground",
        "mujoco.robotics",
        "pgx",
        "toy_text",
        "vizdoom",
    ):
        name = f"envpool.{family}.registration"
        sys.modules.setdefault(name, types.ModuleType(name))
    # EnvPool's XLA interface (env.xla(), which no script uses) imports JAX whenever it is installed, and Kinetix
    # installs it: 0.4-0.5 s of CPU more in each process; a None entry makes its import fail, and EnvPool goes without.
    sys.modules.setdefault("envpool.python.lax", None)
