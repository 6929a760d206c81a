"""docs/extending.md, run as written: every file block of a section (a fenced block whose first
line is `# NAME`) is written to one folder and every command of its bash blocks run there
(`mmrlvr ...` through the CLI's `main`, `python FILE ...` as that script), in this process; each
section's run is one GRPO step on a tiny model, whose metrics say the plug-in took part. The
registries, the family table and `PLUGINS` are restored after each test."""
from __future__ import annotations

import contextlib
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import yaml

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PACKAGES = ("my_methods", "my_transforms", "my_rewards", "my_modalities", "my_models")


def section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(text: str, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(text) if kind == lang]


def files(text: str) -> dict[str, str]:
    """{file name: contents} of the python and yaml blocks that open with `# NAME`."""
    out = {}
    for kind in ("python", "yaml"):
        for body in blocks(text, kind):
            first = body.splitlines()[0]
            assert first.startswith("# "), f"a {kind} block names no file: {first!r}"
            out[first[2:].partition(":")[0].strip()] = body
    return out


def run_section(title: str, where: Path) -> None:
    """Write the section's files into `where` and run its commands there, as a reader would."""
    from mmrlvr.cli import main

    text = section(title)
    for name, body in files(text).items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(body)
    with contextlib.chdir(where):
        for body in blocks(text, "bash"):
            for line in filter(None, (ln.strip() for ln in body.splitlines())):
                argv = shlex.split(line)
                if argv[0] == "mmrlvr":
                    assert main(argv[1:]) == 0, line
                    continue
                assert argv[0] == "python", f"a command the test cannot run: {line}"
                sys.argv = argv[1:]
                try:
                    runpy.run_path(argv[1], run_name="__main__")
                except SystemExit as exit:
                    assert exit.code in (0, None), f"{line} exited {exit.code}"


def step_row(run_dir: Path) -> dict:
    from mmrlvr.train.logger import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] == 1]
    assert len(rows) == 1, f"{run_dir}: no metrics of step 1"
    return rows[0]


def out_dir(where: Path, config: str) -> Path:
    return where / yaml.safe_load((where / config).read_text())["train"]["out_dir"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The tiny Llama, the arithmetic rows and the shared files of "Before you start"."""
    where = tmp_path_factory.mktemp("extending")
    argv = list(sys.argv)
    try:
        run_section("Before you start", where)
    finally:
        sys.argv = argv
    return where


@pytest.fixture()
def isolated(workspace, monkeypatch):
    """Run in the workspace, with the reader's packages importable; what they register is gone
    afterwards."""
    import modalities
    import rewards
    from mmrlvr import models
    from mmrlvr.algo.shaping import SHAPERS
    from mmrlvr.core import registry
    from mmrlvr.core.prompting import PROMPT_TRANSFORMS

    registry.discover()          # mmrlvr.methods registered before the snapshot, so kept after
    for reg in (SHAPERS, PROMPT_TRANSFORMS, rewards.REWARDS, modalities.ADAPTERS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    monkeypatch.setattr(models, "FAMILIES", models.FAMILIES)
    monkeypatch.setattr(models, "_BY_TYPE", dict(models._BY_TYPE))
    monkeypatch.setattr(registry, "PLUGINS", list(registry.PLUGINS))
    monkeypatch.setattr(registry, "_discovered", set(registry._discovered))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.syspath_prepend(str(workspace))
    monkeypatch.chdir(workspace)
    yield workspace
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        sys.modules.pop(name)


def test_the_method_flips_every_advantage_in_a_grpo_step(isolated):
    run_section("Add a method", isolated)
    row = step_row(out_dir(isolated, "method.yaml"))
    assert row["shaping/flip/scale"] == 2.0
    assert row["shaping/flip/mean_abs_delta_adv"] > 0        # the length reward gave spread
    assert row["reward/length/failed"] == 0 and row["optim/grad_norm"] > 0


def test_the_prompt_transform_rewrites_a_share_of_the_training_prompts(isolated):
    from mmrlvr.config import load_config
    from mmrlvr.config.checks import find_problems
    from mmrlvr.core.prompting import Prompting
    from mmrlvr.data import load_split
    from mmrlvr.train.options import plugin_problems

    run_section("Add a prompt transform", isolated)
    row = step_row(out_dir(isolated, "transform.yaml"))
    assert row["reward/length/failed"] == 0 and row["optim/grad_norm"] > 0
    cfg = load_config(str(isolated / "transform.yaml"))
    rows = list(load_split(cfg.data, "train"))
    drawn = Prompting.of(cfg).draw(1)(rows)
    hinted = [ex.prompt.endswith(" Work it out step by step.") for ex in drawn]
    assert any(hinted) and not all(hinted)
    assert [ex.prompt for ex in Prompting.of(cfg).plain().draw(1)(rows)] == [ex.prompt for ex in rows]
    cfg.data.prompt_transforms = [{"name": "hint", "shre": 0.5}]
    assert not find_problems(cfg) and plugin_problems(cfg) == [
        "config key 'data.prompt_transforms[0].shre': prompt transform 'hint' takes no option "
        "'shre' (did you mean 'share'?); it takes ['share', 'text']"]


def test_the_reward_pays_partial_credit_and_its_options_are_checked(isolated):
    import rewards
    from mmrlvr.config import ConfigError, load_config
    from mmrlvr.data import Example
    from mmrlvr.train.options import check_plugins

    run_section("Add a reward", isolated)
    row = step_row(out_dir(isolated, "reward.yaml"))
    assert row["reward/close_number/failed"] == 0 and "reward/close_number/parsed" in row
    assert row["optim/grad_norm"] > 0

    reward = rewards.get("close_number", tolerance=0.1)
    gold = Example(id="g", prompt="?", answer="10")
    scored = reward.score(gold, ["<answer>10</answer>", "<answer>10.5</answer>", "\\boxed{9.8}",
                                 "<answer>12</answer>", "no number", "<answer>nan</answer>"])
    assert [s["overall"] for s in scored] == pytest.approx([1.0, 0.5, 0.8, 0.0, 0.0, 0.0])
    assert [s["parsed"] for s in scored] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="sample w: close_number needs a numeric gold answer"):
        reward.score(Example(id="w", prompt="?", answer="yes"), ["<answer>1</answer>"])

    bad = isolated / "bad.yaml"
    bad.write_text((isolated / "reward.yaml").read_text().replace("tolerance", "tolerence"))
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.tolerence': reward 'close_number' takes "
                                          r"no option 'tolerence' \(did you mean 'tolerance'\?\)"):
        check_plugins(load_config(bad))


def test_the_table_modality_writes_each_rows_table_into_the_prompt(isolated):
    from transformers import AutoTokenizer

    import modalities
    from mmrlvr import models
    from mmrlvr.data import DataError, Example, load_jsonl

    run_section("Add a modality", isolated)
    row = step_row(out_dir(isolated, "modality.yaml"))
    assert row["reward/length/failed"] == 0 and row["optim/grad_norm"] > 0

    shown = [b for kind, b in BLOCK.findall(section("Add a modality")) if kind == ""]
    assert len(shown) == 1                                   # the page's first-row prompt
    adapter = modalities.get("table").bind(models.get("llama"))
    first = load_jsonl(isolated / "data" / "tables.jsonl")[0]
    tokenizer = AutoTokenizer.from_pretrained(isolated / "runs/tiny-llama")
    read = tokenizer.decode(adapter.encode([first], tokenizer).inputs["input_ids"][0])
    assert "<|im_start|>user\n" + shown[0].rstrip("\n") + "<|im_end|>" in read
    plain = modalities.get("text").bind(models.get("llama")).encode([first], tokenizer)
    assert "| fruit | price |" not in tokenizer.decode(plain.inputs["input_ids"][0])
    broken = Example(id="b", prompt="?", answer="1",
                     meta={"table": {"columns": ["fruit", "price"], "rows": [["fig"]]}})
    with pytest.raises(DataError, match="sample b: table row 0 has 1 cells for 2 columns"):
        adapter.build_messages(broken)


def test_the_family_registers_from_a_users_package_and_trains(isolated):
    import json

    from mmrlvr import models
    from mmrlvr.core import registry

    text = section("Add a model family")
    make = next(ln for ln in blocks(text, "bash")[0].splitlines() if "make_tiny_qwen3" in ln)
    (isolated / "make_tiny_qwen3.py").write_text(files(text)["make_tiny_qwen3.py"])
    with contextlib.chdir(isolated):
        sys.argv = shlex.split(make)[1:]
        runpy.run_path("make_tiny_qwen3.py", run_name="__main__")
    tiny = str(isolated / "runs/tiny-qwen3")
    with pytest.raises(models.FamilyError, match="model_type 'qwen3' is not a family mmrlvr"):
        models.resolve(tiny)                                  # mmrlvr alone does not serve it
    (isolated / "my_models").mkdir()
    (isolated / "my_models" / "__init__.py").write_text(files(text)["my_models/__init__.py"])
    registry.PLUGINS.append("my_models")
    assert "my_models" not in sys.modules
    assert models.resolve(tiny).name == "qwen3"               # the miss imported the package

    run_section("Add a model family", isolated)
    row = step_row(out_dir(isolated, "family.yaml"))
    assert row["reward/length/failed"] == 0 and row["optim/grad_norm"] > 0
    final = out_dir(isolated, "family.yaml") / "final"
    assert models.resolve(str(final)).name == "qwen3"
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]


def test_register_refuses_a_model_type_another_family_serves(monkeypatch):
    from mmrlvr import models

    monkeypatch.setattr(models, "FAMILIES", models.FAMILIES)
    monkeypatch.setattr(models, "_BY_TYPE", dict(models._BY_TYPE))

    class Mine(models.Family):
        name, model_types = "mine", ("llama",)

    with pytest.raises(models.FamilyError, match="family mine: model_type 'llama' is already "
                                                 "the llama family's"):
        models.register(Mine())

    class Again(models.Family):
        name, model_types = "llama", ("llama", "llama_like")

    count = len(models.FAMILIES)
    models.register(Again())                     # the same name again replaces the family
    assert len(models.FAMILIES) == count and models.of_type("llama_like") is models.get("llama")
    assert isinstance(models.of_type("llama"), Again)
