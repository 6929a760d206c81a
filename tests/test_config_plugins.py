"""`plugins:` in a config (mmrlvr.config.plugins): the user's packages are imported when the config
loads, by module name or by path (a package dir or a .py file), from the `mmrlvr` command too,
where the working dir is not on sys.path; a missing or failing package is one config error that
names it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mmrlvr.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
REWARD = '''
import rewards


@rewards.register("always_{tag}")
class Always:
    name = "always_{tag}"

    def __init__(self, value: float = 1.0):
        self.value = value

    def score(self, example, completions, progress=0.0):
        return [{{"overall": self.value}} for _ in completions]
'''


@pytest.fixture
def restore(monkeypatch):
    import rewards
    from mmrlvr.core import registry

    monkeypatch.setattr(rewards.REWARDS, "_entries", dict(rewards.REWARDS._entries))
    monkeypatch.setattr(registry, "PLUGINS", list(registry.PLUGINS))
    monkeypatch.setattr(registry, "_discovered", set(registry._discovered))
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("pkg_", "file_")):
            sys.modules.pop(name)


def test_a_package_dir_registers_what_the_config_names(tmp_path, restore):
    import rewards
    from mmrlvr.core import registry
    from mmrlvr.train.options import plugin_problems

    (tmp_path / "pkg_dir").mkdir()
    (tmp_path / "pkg_dir" / "__init__.py").write_text(REWARD.format(tag="dir"))
    cfg = load_config(None, [f"plugins=[{tmp_path / 'pkg_dir'}]",
                             "rewards=[{name: always_dir, value: 0.5}]"])
    assert rewards.get("always_dir", value=0.5).value == 0.5 and "pkg_dir" in registry.PLUGINS
    assert plugin_problems(cfg) == []
    bad = load_config(None, [f"plugins=[{tmp_path / 'pkg_dir'}]", "rewards=[{name: always_dir, valeu: 1}]"])
    assert "did you mean 'value'?" in plugin_problems(bad)[0]


def test_a_py_file_and_a_module_name_load_too(tmp_path, restore, monkeypatch):
    import rewards

    (tmp_path / "file_one.py").write_text(REWARD.format(tag="file"))
    load_config(None, [f"plugins=[{tmp_path / 'file_one.py'}]"])
    assert "always_file" in rewards.REWARDS
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "pkg_named.py").write_text(REWARD.format(tag="named"))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    load_config(None, ["plugins=[pkg_named]"])
    assert "always_named" in rewards.REWARDS


@pytest.mark.parametrize("entry, message", [
    ("pkg_absent", "config key 'plugins': no module 'pkg_absent' (give an importable module name"),
    ("./no/such/dir", "config key 'plugins': './no/such/dir' is not a package dir"),
    ("not a module", "config key 'plugins': 'not a module' is neither a module name nor a path"),
])
def test_a_plugin_that_cannot_be_found_is_named(entry, message, restore):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_config(None, [f"plugins=['{entry}']"])


def test_a_plugin_that_fails_inside_is_named_with_its_error(tmp_path, restore):
    (tmp_path / "pkg_broken").mkdir()
    (tmp_path / "pkg_broken" / "__init__.py").write_text("import json\nraise RuntimeError('oops')\n")
    (tmp_path / "pkg_deps").mkdir()
    (tmp_path / "pkg_deps" / "__init__.py").write_text("import some_dependency_not_installed\n")
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"plugins=[{tmp_path / 'pkg_broken'}, {tmp_path / 'pkg_deps'}]",
                           "train.steps=0"])
    text = str(err.value)
    assert "importing 'pkg_broken' failed: RuntimeError: oops" in text
    assert "train.steps" in text                    # reported with the config's other problems


def test_the_mmrlvr_command_loads_a_path_plugin_from_its_working_dir(tmp_path):
    (tmp_path / "pkg_cli").mkdir()
    (tmp_path / "pkg_cli" / "__init__.py").write_text(
        "from pathlib import Path\nPath('imported').write_text('yes')\n" + REWARD.format(tag="cli"))
    (tmp_path / "rows.jsonl").write_text('{"id": "r0", "prompt": "1 + 1?", "answer": "2"}\n')
    (tmp_path / "run.yaml").write_text("plugins: [./pkg_cli]\n"
                                       "rewards: [{name: always_cli, weight: 1.0}]\n")
    out = subprocess.run([str(ROOT / ".venv/bin/mmrlvr"), "check-method", "structreward",
                          "--config", "run.yaml", "--data", "rows.jsonl"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "imported").read_text() == "yes", out.stderr[-2000:]
    assert "structreward: inactive" in out.stdout, out.stdout + out.stderr[-2000:]
