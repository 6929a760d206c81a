"""Several named eval sets (`data.eval: {name: path}`): the first keeps today's metric names and
files, the others log `eval/<name>/...` and write `eval/<name>/step-N.jsonl`; the summary has
each set's start/end accuracy; `mmrlvr compare` reports every set, the pooled "all sets" block
and pass@k. One path is exactly the single-set run."""
from __future__ import annotations

import json

import pytest

from mmrlvr.compare import compare, markdown, parse_arms
from mmrlvr.config import ConfigError, load_config
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.trainer import train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from mmrlvr.tasks.shapes_ood import make_shapes_with_ood

    out = tmp_path_factory.mktemp("shapes_ood")
    make_shapes_with_ood(out, n_train=24, n_test=6, seed=0, image_size=56, ood=True)
    return out


def _run(tmp_path, tiny_vl, data, name, eval_spec, seed=0, steps=2):
    cfg = load_config(None, [
        f"model.path={tiny_vl}", f"data.train={data / 'train.jsonl'}", f"data.eval={eval_spec}",
        "data.eval_limit=4", "rollout.group_size=2", "rollout.max_new_tokens=6",
        "train.batch_prompts=2", f"train.steps={steps}", "train.eval_samples=2",
        "train.report_to=[]", f"train.seed={seed}", "optim.lr=1e-3",
        f"train.out_dir={tmp_path / name}"])
    return train(cfg, progress=False), tmp_path / name


def test_two_eval_sets_log_write_and_summarise_and_compare(tmp_path, tiny_vl, data):
    two = f"{{in: {data / 'test.jsonl'}, ood: {data / 'test_ood.jsonl'}}}"
    summary, run = _run(tmp_path, tiny_vl, data, "a", two)
    rows = read_metrics(run / "metrics.jsonl")
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:                       # the first set: today's names; the other: eval/ood/*
        assert {"eval/accuracy", "eval/pass@2", "eval/n", "eval/format_rate"} <= set(r)
        assert {"eval/ood/accuracy", "eval/ood/pass@2", "eval/ood/format_rate"} <= set(r)
        assert r["eval/n"] == 4 and r["eval/ood/n"] == 4          # eval_limit per set
    for step in (0, 2):
        first = [json.loads(x) for x in (run / "eval" / f"step-{step}.jsonl").read_text().splitlines()]
        ood = [json.loads(x) for x in (run / "eval" / "ood" / f"step-{step}.jsonl").read_text().splitlines()]
        assert [r["id"] for r in first] == [f"test-{i:06d}" for i in range(4)]
        assert [r["id"] for r in ood] == [f"ood-{i:06d}" for i in range(4)]
        assert all(r["k"] == 2 and isinstance(r["passed"], bool) for r in first + ood)
    assert summary["eval_rows"] == 4 and summary["ood/eval_rows"] == 4
    assert summary["ood/accuracy_start"] == evals[0]["eval/ood/accuracy"]
    assert summary["ood/accuracy_end"] == evals[-1]["eval/ood/accuracy"]
    assert summary["accuracy_end"] == evals[-1]["eval/accuracy"]
    assert json.loads((run / "summary.json").read_text())["ood/accuracy_gain"] == pytest.approx(
        summary["ood/accuracy_end"] - summary["ood/accuracy_start"])

    _, other = _run(tmp_path, tiny_vl, data, "b", two, seed=1)
    report = compare(parse_arms([str(run), str(other)], []), n_boot=200)
    assert list(report["sets"]) == ["eval", "ood"]
    assert report["pooled"]["questions"] == 8 and report["pooled"]["sets"] == ["eval", "ood"]
    for block in [*report["sets"].values(), report["pooled"]]:
        assert block["pass"]["k"] == 2 and len(block["pass"]["rows"]) == 2
    table = markdown(report)
    assert "### ood (4 questions" in table and "### all sets (pooled" in table
    assert "pass@2" in table


def test_one_path_is_the_single_set_run(tmp_path, tiny_vl, data):
    summary, run = _run(tmp_path, tiny_vl, data, "one", str(data / "test.jsonl"), steps=1)
    keys = {k for r in read_metrics(run / "metrics.jsonl") for k in r if k.startswith("eval/")}
    assert keys and not [k for k in keys if k.count("/") > 1 and not k.startswith("eval/family/")]
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step-0.jsonl", "step-1.jsonl"]
    assert not [k for k in summary if "/" in k]


def test_eval_set_config_errors_and_overrides(tmp_path):
    cfg = load_config(None, ["data.eval.in=a.jsonl", "data.eval.ood=b.jsonl"])
    assert cfg.data.eval == {"in": "a.jsonl", "ood": "b.jsonl"}
    with pytest.raises(ConfigError, match="'eval' is not a section.*whole mapping"):
        load_config(None, ["data.eval=a.jsonl", "data.eval.ood=b.jsonl"])
    with pytest.raises(ConfigError, match="must be a path or a mapping"):
        load_config(None, ["data.eval=[a.jsonl]"])
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.eval={yes: a, family: b, x: 3, 'o/d': c}"])
    text = str(err.value)
    assert "set named True" in text and "'family' is taken" in text
    assert "data.eval.x' must be a dataset path" in text and "'o/d'" in text


def test_sampled_eval_leaves_the_training_random_stream_alone(tmp_path, tiny_vl, shapes_dir):
    """pass@k eval samples with its own copy of the RNG: the steps after it are the same as with
    a greedy-only eval, so eval settings never change what a run trains on."""
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import train

    def run(name, samples):
        cfg = load_config(None, [
            f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
            f"data.eval={shapes_dir / 'test.jsonl'}", "data.eval_limit=4",
            "rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.temperature=1.0",
            "train.batch_prompts=2", "train.steps=2", "train.eval_every=1", "train.save_every=0",
            f"train.eval_samples={samples}", f"train.out_dir={tmp_path / name}"])
        train(cfg, progress=False)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k.startswith(("reward/", "loss/", "response/", "policy/"))}
                for r in rows]

    greedy, sampled = run("greedy", 0), run("sampled", 3)
    assert greedy[1]["response/length_mean"] > 0 and greedy == sampled
