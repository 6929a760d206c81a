"""The extension guide's worked example (docs/methods.md, "Adding a method"), run as written: a
package of the user's own registers a credit-shaping method through the core's hook, the core
finds it by the name the config gives, trains a step with it, and a method the config does not
name changes nothing."""
from __future__ import annotations

import sys
import textwrap

import pytest

PLUGIN = textwrap.dedent('''
    """Flip: train every completion towards the opposite of its advantage (a toy method)."""
    from mmrlvr.algo.shaping import SHAPERS


    @SHAPERS.register("flip")
    class Flip:
        name, stage = "flip", "advantage"

        def __init__(self, scale: float = 1.0):
            self.scale = scale

        def shape(self, credit, ctx):
            credit.advantages = -self.scale * credit.advantages
            return {"scale": self.scale}
''')


@pytest.fixture()
def plugin(tmp_path, monkeypatch):
    from mmrlvr.core import registry

    (tmp_path / "my_methods").mkdir()
    (tmp_path / "my_methods" / "__init__.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "PLUGINS", [*registry.PLUGINS, "my_methods"])
    yield "my_methods"
    from mmrlvr.algo.shaping import SHAPERS

    SHAPERS._entries.pop("flip", None)
    registry._discovered.discard("my_methods")
    sys.modules.pop("my_methods", None)


def test_a_users_method_registers_through_the_hook_and_trains(plugin, tmp_path, tiny_vl,
                                                              shapes_dir):
    from mmrlvr.algo.shaping import SHAPERS
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    assert "flip" in SHAPERS                      # found by name: the core imported the package
    (tmp_path / "shaped.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")
    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=8",
                             "train.batch_prompts=2", "train.steps=1",
                             f"train.out_dir={tmp_path / 'run'}"])
    cfg.rewards.append({"name": f"{tmp_path / 'shaped.py'}:length", "weight": 0.5})
    cfg.algo.shaping = [{"name": "flip", "scale": 2.0}]
    metrics = grpo_step(build_run(cfg)[0], 1)
    assert metrics["shaping/flip/scale"] == 2.0
    assert metrics["shaping/flip/mean_abs_delta_adv"] > 0       # it moved the advantages
    assert metrics["optim/grad_norm"] > 0


def test_an_unknown_method_name_lists_the_known_ones():
    from mmrlvr.algo.shaping import build
    from mmrlvr.core.registry import UnknownName

    with pytest.raises(UnknownName, match=r"unknown shaping method 'gappo' \(did you mean 'gapo'\?\)"):
        build([{"name": "gappo"}])
