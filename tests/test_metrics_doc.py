"""docs/metrics.md holds every key a run can log: a tiny run of the quickstart config with the
toolkit options, shapers and an objective that run on CPU in seconds logs no key the page lacks
(SFT's keys: tests/test_report_plots.py; PWSD's: tests/test_pwsd.py), and every
metric-shaped key in the source (literal or f-string) has its row."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from mmrlvr.config import load_config
from mmrlvr.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "metrics.md"
SOURCES = ("mmrlvr", "rewards", "modalities")
ROW = re.compile(r"^\| (.+?) \| (.+?) \| (.+?) \|$")
HOLE = "\x00"                                   # a formatted value of an f-string


def doc_rows() -> list[tuple[list[str], str, str]]:
    """(keys, meaning, unit) of every table row of docs/metrics.md below a `| key |` header."""
    rows, in_table = [], False
    for line in DOC.read_text().splitlines():
        if set(line) <= set("|-") and line:             # the header's rule
            continue
        m = ROW.match(line)
        if not m:
            in_table = False
            continue
        cell, meaning, unit = m.groups()
        if cell == "key":
            in_table = True
        elif in_table:
            rows.append((re.findall(r"`([^`]+)`", cell), meaning.strip(), unit.strip()))
    return rows


def documented() -> list[str]:
    """Every documented key, with `<name>` placeholders; `…` rows stand for others listed."""
    return [k for keys, _, _ in doc_rows() for k in keys if not k.endswith("…")]


def _pattern(key: str) -> re.Pattern:
    parts = re.split(r"(<[^>]+>)", key)
    body = "".join(r"\d+" if p == "<k>" else "[^/]+" if p.startswith("<") else re.escape(p)
                   for p in parts)
    return re.compile(body)


def undocumented(keys) -> list[str]:
    """The keys of `keys` no row of docs/metrics.md covers (`eval/<set>/X` is covered by
    `eval/X`'s row, as the page says)."""
    patterns = [_pattern(k) for k in documented()]
    patterns += [_pattern("eval/<set>/" + k[len("eval/"):]) for k in documented()
                 if k.startswith("eval/")]
    return sorted(k for k in keys if not any(p.fullmatch(k) for p in patterns))


def _segments_unify(code: str, doc: str) -> bool:
    code_re = "".join(".+" if c == HOLE else re.escape(c) for c in code)
    if re.fullmatch(code_re, doc):
        return True
    return bool(_pattern(doc).fullmatch(code.replace(HOLE, "zz")))


def source_keys() -> dict[str, str]:
    """{metric-shaped string in the source (f-string holes as HOLE): file:line}: string
    constants and f-strings of the form `<namespace>/<name>...` for the page's namespaces."""
    spaces = sorted({k.split("/")[0] for k in documented() if "/" in k})
    shape = re.compile(rf"^(?:{'|'.join(spaces)})/[A-Za-z0-9_@{HOLE}/]*[A-Za-z0-9_{HOLE}]$")
    found: dict[str, str] = {}
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                      for v in node.values}                # an f-string's text, not a key
            for node in ast.walk(tree):
                if id(node) in pieces:
                    continue
                if isinstance(node, ast.JoinedStr):
                    text = "".join(v.value if isinstance(v, ast.Constant) else HOLE
                                   for v in node.values)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = node.value
                else:
                    continue
                if shape.match(text):
                    found.setdefault(text, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_row_says_a_meaning_and_a_unit_once():
    rows = doc_rows()
    assert len(rows) > 100
    keys = [k for ks, _, _ in rows for k in ks]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    for ks, meaning, unit in rows:
        assert ks and len(meaning) > 10 and unit, (ks, meaning, unit)


def test_every_metric_key_in_the_source_has_its_row():
    found = source_keys()
    assert {"reward/mean", "rollout/logprob_gap", "update/trained_rows", f"reward/{HOLE}",
            f"shaping/{HOLE}/{HOLE}"} <= set(found)          # the scan sees literals and f-strings
    doc = documented()
    missing = []
    for text, where in found.items():
        if not any(len(text.split("/")) == len(d.split("/")) and
                   all(_segments_unify(c, s) for c, s in zip(text.split("/"), d.split("/")))
                   for d in doc):
            missing.append(f"{text.replace(HOLE, '{…}')} ({where})")
    assert not missing, f"keys the source can log that docs/metrics.md lacks: {missing}"


def test_the_check_catches_an_undocumented_key():
    assert undocumented(["reward/mean", "eval/ood/accuracy", "eval/pass@4",
                         "shaping/gapo/clip_high_mean", "reward/accuracy/parsed"]) == []
    # `reward/<part>` takes any reward's name, so a made-up key needs another namespace
    assert undocumented(["rewards/mean", "update/made_up", "eval/ood/made_up",
                         "shaping/gapo/made_up"]) == ["eval/ood/made_up", "rewards/mean",
                                                      "shaping/gapo/made_up", "update/made_up"]


def test_a_quickstart_run_with_the_cpu_plugins_logs_only_documented_keys(tmp_path, tiny_vl,
                                                                        shapes_dir):
    (tmp_path / "shaped.py").write_text(      # a length reward: groups with spread from step 1
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
        f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
        f"data.eval={shapes_dir / 'test.jsonl'}", "data.eval_limit=2", "train.steps=1", "train.batch_prompts=2", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "train.eval_reward=true", "train.eval_samples=2",
        "algo.beta=0.04", "algo.rollout_correction=tis", "algo.mask_truncated=true",
        "train.dynamic_sampling=true", "train.dynamic_max_draws=1",
        f"train.out_dir={tmp_path / 'run'}", "train.report_to=[]"])
    cfg.rewards.append({"name": f"{tmp_path / 'shaped.py'}:length", "weight": 0.5})
    cfg.algo.shaping = [{"name": n} for n in ("gmts", "cue_grpo", "cliff", "om_grpo")]
    cfg.objectives = [{"name": "recycling", "weight": 0.1}]
    train(cfg, progress=False)
    keys = set()
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        keys |= set(json.loads(line))
    # the run reached every stage whose keys the page holds: not a vacuous pass
    assert {"policy/entropy", "loss/kl", "rollout/logprob_gap", "rollout/correction_ratio_mean",
            "update/truncated_masked_frac", "sampling/draws", "eval/pass@2", "eval/reward/format",
            "eval/family/kind", "shaping/gmts/kept_frac", "shaping/cliff/judged",
            "objective/recycling/instances",
            "verify/parse_fail_rate", "run/world_size"} <= keys
    assert undocumented(keys) == [], "keys the run logged that docs/metrics.md lacks"


@pytest.mark.parametrize("key", ["reward/mean", "eval/accuracy", "loss/kl", "policy/entropy",
                                 "rollout/logprob_gap", "response/length_mean",
                                 "reward/zero_spread_frac", "loss/clip_frac", "sft/loss"])
def test_the_keys_the_report_plots_are_documented(key):
    assert undocumented([key]) == []
