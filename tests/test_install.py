"""The reproducible install (scripts/constraints.txt): every package mmrlvr and its test extras
depend on is pinned to one version, the pins parse, scripts/setup.sh installs under them, and the
environment the suite runs in holds the pinned versions of mmrlvr's own dependencies (the README's
figures were measured with them: a drift here is a drift in those figures)."""
from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")      # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "scripts" / "constraints.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out = {}
    for n, line in enumerate(CONSTRAINTS.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        assert m, f"scripts/constraints.txt line {n}: {line!r} is not NAME==VERSION"
        assert canonical(m[1]) not in out, f"scripts/constraints.txt line {n}: {m[1]} pinned twice"
        out[canonical(m[1])] = m[2]
    return out


def declared() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["test"]
    return [canonical(re.match(r"[A-Za-z0-9._-]+", r)[0]) for r in reqs]


def test_every_dependency_and_test_extra_is_pinned():
    pinned = pins()
    missing = [name for name in declared() if name not in pinned]
    assert not missing, f"scripts/constraints.txt pins none of {missing}: add NAME==VERSION lines"


def test_setup_installs_under_the_constraints():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    installs = [ln for ln in setup.splitlines() if "pip install" in ln and "--no-deps" not in ln
                and "--upgrade pip" not in ln]
    assert installs and all("-c scripts/constraints.txt" in ln for ln in installs), installs
    assert "scripts/constraints.txt" in next(ln for ln in setup.splitlines() if ln.startswith("want="))


def test_the_suite_runs_on_the_pinned_versions_of_mmrlvrs_dependencies():
    pinned = pins()
    drift = {}
    for name in declared():
        have = metadata.version(name)
        if have.split("+")[0] != pinned[name].split("+")[0]:
            drift[name] = (have, pinned[name])
    assert not drift, (f"installed vs scripts/constraints.txt: {drift}; re-run scripts/setup.sh, "
                       "or regenerate the constraints (their header says how) and re-measure the "
                       "README's figures")
