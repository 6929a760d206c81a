"""The demo finds a run's examples whatever data layout the run trained from: a TRL dataset
saved with `save_to_disk` (in-memory PIL images), its parquet, a DatasetDict split
(`PATH@SPLIT`), EasyR1 and ms-swift JSONL, `data.columns` and a `layout:` prefix; then a real
Gradio server hands a clicked TRL example to the Vision tab through gradio_client."""
from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import yaml
from PIL import Image

from apps.runinfo import read_run
from tests.apps_helpers import free_port, write_model_run

pytestmark = pytest.mark.filterwarnings("ignore:::gradio.queueing")
N = 6


def _shapes(shapes_dir: Path) -> list[dict]:
    """The first N shapes test rows, each question made unique (questions repeat there)."""
    rows = [json.loads(line) for line in (shapes_dir / "test.jsonl").read_text().splitlines()[:N]]
    return [{**r, "prompt": f"{r['prompt']} (row {i})"} for i, r in enumerate(rows)]


def _trl(shapes_dir: Path) -> datasets.Dataset:
    """TRL's vision GRPO layout: a conversational `prompt`, a PIL `image`, `solution`."""
    rows = _shapes(shapes_dir)
    return datasets.Dataset.from_dict({
        "prompt": [[{"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": r["prompt"]}]}]
                   for r in rows],
        "image": [Image.open(shapes_dir / r["images"][0]).convert("RGB") for r in rows],
        "solution": [str(r["answer"]) for r in rows]})


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, shapes_dir):
    """{name: (data spec, data.columns or None)}, each the shapes test rows in one layout."""
    root = tmp_path_factory.mktemp("layouts")
    rows = _shapes(shapes_dir)
    trl = _trl(shapes_dir)
    trl.save_to_disk(str(root / "trl_saved"))
    trl.to_parquet(str(root / "trl.parquet"))
    datasets.DatasetDict({"train": trl, "test": trl}).save_to_disk(str(root / "trl_dict"))
    images = [str(shapes_dir / r["images"][0]) for r in rows]     # absolute: allow_outside
    easyr1 = _jsonl(root / "easyr1.jsonl", [{"problem": r["prompt"], "answer": r["answer"],
                                            "images": [im]} for r, im in zip(rows, images)])
    swift = _jsonl(root / "swift.jsonl", [
        {"messages": [{"role": "user", "content": f"<image>{r['prompt']}"},
                      {"role": "assistant", "content": str(r["answer"])}], "images": [im]}
        for r, im in zip(rows, images)])
    own = _jsonl(root / "own.jsonl", [{"q": r["prompt"], "gold": r["answer"], "pic": [im]}
                                      for r, im in zip(rows, images)])
    steps = _jsonl(root / "steps.jsonl", [{"question": r["prompt"], "answer": r["answer"],
                                           "steps": ["look", "count"], "images": [im]}
                                          for r, im in zip(rows, images)])
    return {"trl save_to_disk": (str(root / "trl_saved"), None),
            "trl parquet": (str(root / "trl.parquet"), None),
            "DatasetDict@split": (f"{root / 'trl_dict'}@test", None),
            "easyr1 jsonl": (str(easyr1), None), "ms-swift jsonl": (str(swift), None),
            "data.columns": (str(own), {"prompt": "q", "answer": "gold", "images": "pic"}),
            "layout: prefix": (f"steps:{steps}", None)}


def _run_on(root: Path, tiny_vl: Path, spec: str, columns: dict | None) -> Path:
    run = write_model_run(root, tiny_vl, tiny_vl, Path("placeholder"))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"].update({"train": spec, "eval": spec, "allow_outside": True,
                        **({"columns": columns} if columns else {})})
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


@pytest.mark.parametrize("name", ["trl save_to_disk", "trl parquet", "DatasetDict@split",
                                  "easyr1 jsonl", "ms-swift jsonl", "data.columns",
                                  "layout: prefix"])
def test_the_examples_come_from_every_layout_a_run_trains_from(tmp_path, tiny_vl, shapes_dir,
                                                               layouts, name):
    spec, columns = layouts[name]
    info = read_run(_run_on(tmp_path / "run", tiny_vl, spec, columns))
    rows = _shapes(shapes_dir)
    assert info.examples_note == "" and len(info.examples) == N, info.examples_note
    assert sorted(ex.prompt for ex in info.examples) == sorted(r["prompt"] for r in rows)
    by_prompt = {r["prompt"]: r for r in rows}
    for ex in info.examples:
        assert ex.answer == str(by_prompt[ex.prompt]["answer"])
        image = Path(ex.images[0])                       # a file the inputs and server take
        source = Image.open(shapes_dir / by_prompt[ex.prompt]["images"][0]).convert("RGB")
        assert np.array_equal(np.asarray(Image.open(image).convert("RGB")), np.asarray(source))


def test_a_run_whose_data_is_elsewhere_says_so_not_to_pass_run(tmp_path, tiny_vl):
    info = read_run(_run_on(tmp_path / "run", tiny_vl, "runs/gone/train.parquet", None))
    assert info.examples == [] and "`runs/gone/train.parquet`" in info.examples_note
    assert "not on this machine" in info.examples_note


def test_the_server_hands_a_trl_example_to_the_vision_tab(tmp_path, tiny_vl, shapes_dir,
                                                          layouts):
    from gradio_client import Client, handle_file

    from apps.launcher import build_demo, launch, load_context, media_files

    spec, _ = layouts["trl save_to_disk"]
    run = _run_on(tmp_path / "run", tiny_vl, spec, None)
    ctx = load_context(str(run / "final"), str(run), device="cpu", compare="none")
    assert len(ctx.info.examples) == N
    demo = build_demo(ctx)
    url = launch(demo, port=free_port(), block=False, allowed=media_files(ctx))
    try:
        client = Client(url, verbose=False)
        files, question, gold, *_, status = client.predict(2, api_name="/vision_example")
        example = ctx.info.examples[2]
        assert (question, gold) == (example.prompt, example.answer) and "Example" in status
        served = np.asarray(Image.open(files[0]).convert("RGB"))
        assert np.array_equal(served, np.asarray(Image.open(example.images[0]).convert("RGB")))
        *_, status = client.predict([handle_file(f) for f in files], question, gold, False, 1.0,
                                    8, ctx.format_prompt, False, api_name="/vision_answer")
        assert status.startswith("✓ done: trained ")
    finally:
        demo.close()
