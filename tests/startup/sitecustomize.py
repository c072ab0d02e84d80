"""Loaded at the start of every Python process the tests launch (conftest.py puts this folder on their PYTHONPATH).

`import envpool` registers all of EnvPool's task families, and Jumanji's and PGX's registrations alone import JAX and
matplotlib: about 1.3 s of CPU of the 4-5 s that each script's imports take, in the 100-odd processes of the suite. No
script of the project uses those families (Atari, Procgen and MuJoCo's Gymnasium tasks only), so their registration
modules are left out here. The pytest process itself registers every family (the in-process tests of the scripts'
task checks see EnvPool as a user does). TESTS_FULL_ENVPOOL=1 turns this off.

torch's optimizers import Dynamo (torch.compile's tracer) on their first call, compiled or not: `Optimizer.step` to mark
graph breaks, `zero_grad`, `state_dict` and the others to exclude themselves from tracing. That import is 2.0-2.3 s of
CPU, a third of each tiny training process's (6.9 -> 4.8 s, ppo_atari_envpool.py, 2026-11-29). Until something imports
Dynamo, nothing can be compiling, and those markers do nothing: here they wait for that import (`_dynamo_on_demand`)
and are the same calls as torch's from then on (a `--compile` run imports it first). The losses of a seeded run are
bit-identical either way. torch versions whose optimizers are built otherwise are left as they are.
TESTS_EAGER_DYNAMO=1 turns this off."""

import functools
import importlib.util
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


def _dynamo_on_demand(optim):
    """Make torch.optim's Dynamo markers wait for Dynamo's import (see the docstring above)."""
    import torch

    def disabled_once_dynamo_is_imported(method):  # what torch._disable_dynamo's wrapper caches, built on demand
        def call(*args, **kwargs):
            if "torch._dynamo" not in sys.modules:
                return method(*args, **kwargs)
            method.__dynamo_disable = torch._dynamo.disable(method, True, wrapping=False)
            return method.__dynamo_disable(*args, **kwargs)

        return call

    def step_with_graph_breaks_once_dynamo_is_imported(use_grad):  # torch.optim.optimizer._use_grad_for_differentiable
        step = use_grad.__wrapped__

        @functools.wraps(step)
        def call(self, *args, **kwargs):
            if "torch._dynamo" in sys.modules:
                return use_grad(self, *args, **kwargs)
            with torch.set_grad_enabled(self.defaults["differentiable"]):
                return step(self, *args, **kwargs)

        return call

    for method in vars(optim.Optimizer).values():
        code = getattr(method, "__code__", None)
        if code and code.co_name == "inner" and code.co_freevars == ("fn", "recursive") and hasattr(method, "__wrapped__"):
            method.__wrapped__.__dynamo_disable = disabled_once_dynamo_is_imported(method.__wrapped__)
    for optimizer in vars(optim).values():
        if isinstance(optimizer, type) and issubclass(optimizer, optim.Optimizer) and "step" in vars(optimizer):
            code, step = getattr(optimizer.step, "__code__", None), optimizer.step
            if code and code.co_name == "_use_grad" and code.co_freevars == ("func",) and hasattr(step, "__wrapped__"):
                optimizer.step = step_with_graph_breaks_once_dynamo_is_imported(optimizer.step)


class _AfterTorchOptim:
    """Runs _dynamo_on_demand once torch.optim (imported by `import torch`) has been executed."""

    def find_spec(self, name, path, target=None):
        if name != "torch.optim":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_module_then_patch(module):
            exec_module(module)
            _dynamo_on_demand(module)

        spec.loader.exec_module = exec_module_then_patch
        return spec


if os.environ.get("TESTS_EAGER_DYNAMO") != "1":
    sys.meta_path.insert(0, _AfterTorchOptim())
