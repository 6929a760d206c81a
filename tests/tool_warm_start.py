"""What the tool tasks' warm-start tests share (tests/test_zoom_task.py, tests/test_clip_task.py,
tests/test_multiprocess_tools.py): a tiny model whose tokenizer learnt the rows' gold
trajectories, a supervised warm start on them, and two GRPO steps whose rollouts call the tool."""
from __future__ import annotations

import json
from pathlib import Path


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def warm_start(tmp_path: Path, kind: str, data: Path, common: list[str],
               batch_size: int = 2) -> tuple[Path, list[dict]]:
    """`kind` built with the train rows' trajectory texts in its tokenizer's corpus (as `mmrlvr
    tiny --corpus` does), then 60 SFT steps on the rows' gold trajectories with `common`
    overrides: the SFT model dir and its metrics rows."""
    from mmrlvr.config import load_config
    from mmrlvr.data.loading import load_jsonl
    from mmrlvr.tiny import build_tiny
    from mmrlvr.train.sft import sft

    rows = load_jsonl(data / "train.jsonl")
    corpus = [t["text"] for ex in rows for t in ex.meta["trajectory"]] * 20
    tiny = build_tiny(kind, tmp_path / "tiny", extra_corpus=corpus)
    sft(load_config(None, common + [
        f"model.path={tiny}", "sft.steps=60", f"sft.batch_size={batch_size}", "sft.lr=5e-3",
        "sft.warmup_steps=2", f"sft.out_dir={tmp_path / 'sft'}"]), progress=False)
    return tmp_path / "sft" / "final", jsonl(tmp_path / "sft" / "metrics.jsonl")


def grpo_tool_steps(tmp_path: Path, model: Path, common: list[str]) -> list[dict]:
    """Two GRPO steps from `model` (2 prompts × 2 rollouts at temperature 0.3): the metrics rows
    that logged tool figures."""
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import train

    train(load_config(None, common + [
        f"model.path={model}", "rollout.group_size=2", "rollout.temperature=0.3",
        "train.batch_prompts=2", "train.micro_batch=4", "train.steps=2", "train.save_every=0",
        f"train.out_dir={tmp_path / 'grpo'}"]), progress=False)
    return [r for r in jsonl(tmp_path / "grpo" / "metrics.jsonl") if "tools/calls_per_rollout" in r]
