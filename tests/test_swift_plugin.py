"""An ms-swift GRPO reward plugin loads unchanged from `plugin.py:Class` (or the name it registers
in `orms`) whether or not ms-swift is installed: without it, `rewards/swift_standin.py` stands in
for the names plugins import (`from swift.plugin import ORM, orms`, `from swift.rewards import
...`); with it, the real package is used. Each case runs in a fresh interpreter, since the
stand-in, once installed, stays in `sys.modules`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
from typing import List

from swift.plugin import ORM, orms
from swift.rewards import AsyncORM
from swift.utils import get_logger

logger = get_logger()


class AnswerAccuracy(ORM):
    def __call__(self, completions, solution, **kwargs) -> List[float]:
        return [float(s in c) for c, s in zip(completions, solution)]


class LengthBonus(AsyncORM):
    async def __call__(self, completions, **kwargs) -> List[float]:
        return [min(len(c), 10) / 10.0 for c in completions]


class Unfinished(ORM):          # no __call__: every call fails, counted
    pass


orms["answer_acc"] = AnswerAccuracy
'''

SCORE = '''
import json, sys
import rewards
from mmrlvr.data import Example

ex = Example(id="q1", prompt="How many?", answer="3")
out = {}
for name in sys.argv[2:]:
    combined = rewards.build_combined([{"name": f"{sys.argv[1]}:{name}"}])
    out[name] = combined.score(ex, ["<answer>3</answer>", "<answer>4</answer>"])
out["swift_is_standin"] = getattr(sys.modules["swift"], "__mmrlvr_standin__", False)
print(json.dumps(out))
'''


def _run(tmp_path: Path, script: str, *args: str, path: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (path, str(ROOT)) if p)}
    (tmp_path / "score.py").write_text(script)
    return subprocess.run([sys.executable, str(tmp_path / "score.py"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)


def _standin_only():
    from rewards.swift_standin import real_swift_installed

    # not importlib.util.find_spec: once an earlier test in this process put the stand-in in
    # sys.modules (a module without __spec__), find_spec raises ValueError
    if real_swift_installed():
        pytest.skip("ms-swift is installed here: the stand-in is not used")


def test_a_swift_plugin_loads_and_scores_without_ms_swift(tmp_path):
    _standin_only()
    (tmp_path / "plugin.py").write_text(PLUGIN)
    done = _run(tmp_path, SCORE, str(tmp_path / "plugin.py"), "AnswerAccuracy", "answer_acc",
                "LengthBonus", "Unfinished")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["swift_is_standin"] is True
    assert [s["overall"] for s in out["AnswerAccuracy"]] == [1.0, 0.0]
    assert [s["overall"] for s in out["answer_acc"]] == [1.0, 0.0]      # by its orms name
    assert [s["overall"] for s in out["LengthBonus"]] == [1.0, 1.0]     # async ORM: awaited
    unfinished = out["Unfinished"]                                      # scored 0 and counted
    assert [s["overall"] for s in unfinished] == [0.0, 0.0]
    assert [s["Unfinished/failed_error"] for s in unfinished] == [1.0, 1.0]


def test_the_real_ms_swift_is_used_when_it_is_installed(tmp_path):
    fake = tmp_path / "site" / "swift"            # an installed `swift` package, as pip puts it
    (fake / "plugin").mkdir(parents=True)
    (fake / "rewards").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "utils.py").write_text("import logging\nget_logger = logging.getLogger\n")
    (fake / "plugin" / "__init__.py").write_text(
        "class ORM:\n    real = True\n    def __call__(self, completions, **kw):\n"
        "        raise NotImplementedError\norms = {}\n")
    (fake / "rewards" / "__init__.py").write_text(
        "from swift.plugin import ORM, orms\nclass AsyncORM(ORM):\n    pass\n")
    (tmp_path / "plugin.py").write_text(PLUGIN + "\nassert ORM.real\n")
    done = _run(tmp_path, SCORE, str(tmp_path / "plugin.py"), "AnswerAccuracy",
                path=str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["swift_is_standin"] is False
    assert [s["overall"] for s in out["AnswerAccuracy"]] == [1.0, 0.0]


def test_a_plugin_needing_more_of_ms_swift_is_one_line_naming_what_to_install(tmp_path):
    _standin_only()
    (tmp_path / "plugin.py").write_text("from swift.llm import Template\nfrom swift.plugin import ORM\n")
    script = '''
import sys
import rewards
from mmrlvr.config import ConfigError
try:
    rewards.get(sys.argv[1] + ":X")
except ConfigError as err:          # what the CLI reports as one line, exit 2
    print("ERR", err)
'''
    done = _run(tmp_path, script, str(tmp_path / "plugin.py"))
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("ERR ") and "\n" not in line
    assert "plugin.py" in line and "swift.llm" in line and "pip install ms-swift" in line
