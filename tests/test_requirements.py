"""requirements.txt, requirements-nodeps.txt and constraints.txt agree, so that `make setup` can install them together
(pip refuses two pins of one package that differ, and only after it has downloaded everything), and the Makefile installs
requirements-nodeps.txt (Kinetix, whose published dependencies clash with ours) with `--no-deps`."""

import importlib.metadata
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pins(name: str) -> dict[str, str]:
    """{package: version} of a pip requirements file whose every entry is `package==version`; names normalised as
    pip does (PEP 503)."""
    lines = [line.strip() for line in (ROOT / name).read_text().splitlines()]
    entries = [line for line in lines if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+", entry) for entry in entries), name
    return {re.sub(r"[-_.]+", "-", entry.split("==")[0]).lower(): entry.split("==")[1] for entry in entries}


def test_constraints_pin_every_requirement_at_its_version_and_leave_torchs_build_to_requirements():
    requirements, constraints = pins("requirements.txt"), pins("constraints.txt")
    assert requirements["torch"] == "2.13.0" and "torch" not in constraints  # `+cpu` there would refuse the CUDA build
    assert {name: constraints.get(name) for name in requirements if name != "torch"} == {
        name: version for name, version in requirements.items() if name != "torch"
    }
    assert len(constraints) > 2 * len(requirements)  # the packages they pull in as well


def recipe(target: str) -> list[str]:
    """The command lines of a Makefile rule (the tab-indented lines under `target:`), comments left out."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        if not line.lstrip().startswith("#"):
            body.append(line.strip())
    return body


def test_nodeps_packages_are_pinned_exactly_constrained_and_installed():
    requirements, nodeps, constraints = pins("requirements.txt"), pins("requirements-nodeps.txt"), pins("constraints.txt")
    # Kinetix and the JAX libraries that ppo_kinetix.py's imports load from it (pins() refuses an entry without `==`)
    assert set(nodeps) == {"kinetix-env", "jax2d", "jaxgl", "gymnax", "flax"}
    assert not set(nodeps) & set(requirements)  # one file installs each, with or without its dependencies
    assert {name: constraints.get(name) for name in nodeps} == nodeps  # `make constraints` freezes them too
    assert requirements["jax"] == requirements["jaxlib"]
    # what `make setup` installed into the interpreter that runs the tests
    assert {name: importlib.metadata.version(name) for name in nodeps} == nodeps


def test_makefile_installs_nodeps_without_dependencies_after_requirements_and_in_constraints():
    makefile = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^STAMP := .*\$\(shell cat ([^|]*)\|", makefile, re.MULTILINE)
    assert stamp and "requirements-nodeps.txt" in stamp.group(1).split()  # a change to it installs again
    assert "requirements-nodeps.txt" in re.search(r"^\$\(STAMP\):(.*)$", makefile, re.MULTILINE).group(1).split()
    for target, pip in (("$(STAMP)", "$(PY) -m pip install"), ("constraints", "$(VENV)-constraints/bin/pip install")):
        lines = recipe(target)
        installs = [i for i, line in enumerate(lines) if line.startswith(pip) and "-r requirements" in line]
        assert [lines[i].split("-r ")[1].split()[0] for i in installs] == ["requirements.txt", "requirements-nodeps.txt"]
        assert "--no-deps" in lines[installs[1]].split() and "--no-deps" not in lines[installs[0]].split()
