"""One prompting object (`mmrlvr.core.prompting.Prompting`): a step's draw of the template pool is
the draw the trainer made before it (so runs with `data.templates` train as they did), no
transform leaves the examples and the rng untouched, its `encode` is the adapter's with the run's
system turn and format instruction, a registered prompt transform rewrites training prompts and
never eval's, the length check at load measures what a transform makes, and an unknown transform
or option is a config error before any weights load."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mmrlvr.config import ConfigError, load_config
from mmrlvr.config.checks import find_problems
from mmrlvr.core.prompting import PROMPT_TRANSFORMS, Prompting
from mmrlvr.core.templates import TRAIN_TEMPLATES, apply_templates, template_rng
from mmrlvr.data import DataError, Example, LoadReport, load_split
from mmrlvr.train.options import plugin_problems


@dataclasses.dataclass(frozen=True)
class Suffix:
    """A test transform: `text` appended to every question."""

    text: str = " Think first."

    def __call__(self, examples, rng):
        return [dataclasses.replace(ex, prompt=ex.prompt + self.text) for ex in examples]

    def variants(self, example):
        return [dataclasses.replace(example, prompt=example.prompt + self.text)]


@pytest.fixture
def suffix():
    PROMPT_TRANSFORMS.register("suffix", Suffix)
    yield
    PROMPT_TRANSFORMS._entries.pop("suffix", None)


def _examples(n=6):
    return [Example(id=f"q{i}", prompt=f"What is {i} + 1?", answer=str(i + 1)) for i in range(n)]


def _cfg(tmp_path, tiny_vl, shapes_dir, *overrides):
    return load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                              "model.min_pixels=3136", "model.max_pixels=12544",
                              f"data.eval={shapes_dir / 'test.jsonl'}", "data.eval_limit=4",
                              "rollout.group_size=2", "rollout.max_new_tokens=4",
                              "train.batch_prompts=2", "train.micro_batch=4", "train.eval_batch=4",
                              "train.report_to=[]", f"train.out_dir={tmp_path / 'run'}",
                              *overrides])


def test_a_steps_draw_is_the_template_pool_draw_the_trainer_made_before():
    cfg = load_config(None, ["train.seed=7"])
    cfg.data.templates = list(TRAIN_TEMPLATES)
    prompting, examples = Prompting.of(cfg), _examples()
    draw, rng = prompting.draw(3), template_rng(7, 3)
    for _ in range(2):            # dynamic sampling draws again within a step: the rng goes on
        assert draw(examples) == apply_templates(examples, TRAIN_TEMPLATES, rng)
    assert draw(examples) != prompting.draw(4)(examples)       # another step, another draw
    assert {ex.meta["template"] for ex in prompting.draw(3)(examples * 4)} > {0}


def test_without_a_transform_the_examples_and_the_rng_are_untouched():
    prompting, examples = Prompting.of(load_config(None, [])), _examples()
    draw = prompting.draw(1)
    state = draw.rng.getstate()
    assert draw(examples) is examples and draw.rng.getstate() == state
    assert prompting.variants(examples[0]) == [examples[0]]


def test_encode_is_the_adapters_encode_with_the_runs_system_turn_and_format(policy, shapes_dir):
    rows = list(load_split(load_config(None, [f"data.train={shapes_dir / 'train.jsonl'}"]).data,
                           "train"))[:3]
    prompting = Prompting(system="Be brief.", format="Answer in <answer></answer>.")
    got = prompting.encode(policy, rows)
    want = policy.adapter.encode(rows, policy.processor, system_prompt="Be brief.",
                                 format_prompt="Answer in <answer></answer>.")
    assert got.inputs.keys() == want.inputs.keys()
    assert all(torch.equal(got.inputs[k], want.inputs[k]) for k in want.inputs)
    text = policy.processor.tokenizer.decode(got.inputs["input_ids"][0])
    assert "Be brief." in text and "Answer in <answer></answer>." in text
    assert prompting.plain() == prompting              # no transform to drop


def test_a_registered_transform_rewrites_training_prompts_and_never_evals(
        tmp_path, tiny_vl, shapes_dir, suffix):
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import draw_batch, run_eval

    cfg = _cfg(tmp_path, tiny_vl, shapes_dir)
    cfg.data.prompt_transforms = [{"name": "suffix", "text": " Count carefully."}]
    run = build_run(cfg)[0]
    drawn = draw_batch(run, 1, run.prompting.draw(1))
    assert drawn.examples and all(ex.prompt.endswith(" Count carefully.") for ex in drawn.examples)
    ids = drawn.rollouts.prompts.inputs["input_ids"][0]
    assert "Count carefully." in run.policy.processor.tokenizer.decode(ids)
    run_eval(run, 0)
    records = [json.loads(line) for line in (tmp_path / "run" / "eval" / "step-0.jsonl").open()]
    assert len(records) == 4 and not any("Count carefully" in r["prompt"] for r in records)


def test_the_length_check_at_load_measures_what_a_transform_makes(tmp_path, tiny_vl, shapes_dir,
                                                                  suffix):
    from mmrlvr.train.lengths import prompt_budget

    cfg = _cfg(tmp_path, tiny_vl, shapes_dir, "data.max_prompt_tokens=60")
    assert len(load_split(cfg.data, "train", LoadReport(), prompt_budget(cfg))) > 0   # fits
    cfg.data.prompt_transforms = [{"name": "suffix", "text": " and then" * 40}]
    with pytest.raises(DataError, match=r"train\.jsonl, row 1 \(id train-0+\).*60"):
        load_split(cfg.data, "train", LoadReport(), prompt_budget(cfg))


def test_an_unknown_transform_or_option_is_a_config_error_before_weights_load(
        tmp_path, tiny_vl, shapes_dir, suffix, monkeypatch):
    from mmrlvr.train import setup

    cfg = _cfg(tmp_path, tiny_vl, shapes_dir)
    cfg.data.prompt_transforms = [{"name": "suffix", "txt": "!"}]
    assert plugin_problems(cfg) == [
        "config key 'data.prompt_transforms[0].txt': prompt transform 'suffix' takes no option "
        "'txt' (did you mean 'text'?); it takes ['text']"]
    cfg.data.prompt_transforms = [{"text": "!"}]
    assert find_problems(cfg) == ["config key 'data.prompt_transforms[0]' needs a 'name', e.g. "
                                  "{name: templates, templates: ['Q: {question}']}"]
    cfg.data.prompt_transforms = [{"name": "sufix"}]
    monkeypatch.setattr(setup, "load_policy", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match="unknown prompt transform 'sufix' \\(did you mean "
                                          "'suffix'\\?\\)"):
        setup.build_run(cfg)


def test_a_templates_entry_is_the_data_templates_pool():
    cfg = load_config(None, ["train.seed=2"])
    pool = ["Q: {question}", "Question: {question}"]
    cfg.data.prompt_transforms = [{"name": "templates", "templates": pool}]
    via_hook, examples = Prompting.of(cfg), _examples()
    cfg.data.prompt_transforms, cfg.data.templates = [], pool
    assert via_hook.draw(5)(examples) == Prompting.of(cfg).draw(5)(examples)
    assert [v.prompt for v in via_hook.variants(examples[0])] == \
        ["Q: What is 0 + 1?", "Question: What is 0 + 1?"]
