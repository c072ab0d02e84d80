"""requirements.txt and constraints.txt agree, so that `make setup` can install them together (pip refuses two pins of
one package that differ, and only after it has downloaded everything)."""

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
