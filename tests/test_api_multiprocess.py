"""The Python API under torchrun: a script that builds its rows in memory and calls
`GRPOTrainer(..., args=GRPOConfig(...)).train()`, started as `torchrun --nproc_per_node 2`
(gloo, CPU), trains as `torchrun ... mmrlvr train` does (tests/test_multiprocess.py): rank 0
alone writes the run's data, the ranks score disjoint prompts each step and end with the same
weights, and callbacks and the summary are rank 0's; `evaluate()` then runs on every rank, each
scoring its share of the rows as the run's eval does, and gives every rank the figures one
process gets on the same model and rows. `accelerate launch --multi_gpu` (torchrun underneath)
runs such a script on two ranks on CPU too; `accelerate launch --cpu --num_processes 2` starts one
process, which the trainer refuses, naming torchrun."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrlvr.train.logger import read_metrics
from tests.test_multiprocess import env, free_port, run_ok, torchrun

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = '''
import json, os, sys
from PIL import Image
from mmrlvr import GRPOConfig, GRPOTrainer

def traced(completions, qid, **kwargs):        # TRL's convention; notes which rank scored what
    with open(os.environ["MMRLVR_TRACE"] + "." + os.environ["RANK"], "a") as fh:
        fh.writelines(q + "\\n" for q in qid)
    return [min(len(c), 20) / 20 for c in completions]

class Rows(list):                                # a list of row dicts that notes who reads it
    def __iter__(self):
        with open(os.environ["MMRLVR_TRACE"] + ".read" + os.environ["RANK"], "a") as fh:
            fh.write("read\\n")
        return super().__iter__()

if __name__ == "__main__":
    model, out = sys.argv[1:3]
    n = 8
    ds = Rows({"prompt": f"<image>How many squares? ({i})", "solution": str(i % 3 + 1),
               "image": Image.new("RGB", (56, 56), (30 * i, 100, 200 - 20 * i)), "qid": f"q{i}"}
              for i in range(n))
    held_out = Rows(ds[:4])                      # a slice: read by no one yet
    args = GRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=2,
                      max_steps=2, max_completion_length=6, learning_rate=1e-3, seed=5,
                      report_to="none", use_cpu=True, per_device_eval_batch_size=2)
    logged = []
    trainer = GRPOTrainer(model=model, reward_funcs=[traced], args=args, train_dataset=ds,
                          callbacks=[lambda step, metrics: logged.append(step)],
                          overrides=["model.min_pixels=3136", "model.max_pixels=3136"])
    summary = trainer.train()
    figures = trainer.evaluate(held_out)
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as fh:
        json.dump({"summary": summary, "logged": logged, "figures": figures,
                   "batch_prompts": trainer.args.train.batch_prompts}, fh)
'''


def test_a_grpo_trainer_script_under_torchrun_trains_its_ranks_in_step(tmp_path, tiny_vl):
    script, run, trace = tmp_path / "train.py", tmp_path / "run", tmp_path / "trace"
    script.write_text(SCRIPT)
    run_ok(torchrun(str(script), str(tiny_vl), str(run)),
           env=env(MMRLVR_TRACE=str(trace), PYTHONPATH=str(ROOT)), cwd=tmp_path)
    ranks = [json.loads(Path(f"{run}.rank{r}.json").read_text()) for r in (0, 1)]
    # 4 completions a forward x 2 processes / 2 per prompt: 4 prompts a step, 2 on each rank
    assert [r["batch_prompts"] for r in ranks] == [4, 4]
    summary = ranks[0]["summary"]
    assert summary == json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp"
    assert summary["ranks_in_sync"] is True          # every rank's weights fingerprinted equal
    figures = ranks[0].pop("figures")
    assert ranks[1].pop("figures") == figures        # every rank gets the figures
    assert ranks[1] == {"summary": {}, "logged": [], "batch_prompts": 4}   # rank 0's alone
    assert ranks[0]["logged"] == [1, 2] == [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    rows = (run / "data" / "train.jsonl").read_text().splitlines()
    assert [json.loads(r)["qid"] for r in rows] == [f"q{i}" for i in range(8)]
    assert Path(f"{trace}.read0").read_text().count("read") == 2   # the rows, then the held-out rows
    assert not Path(f"{trace}.read1").exists()       # rank 0 alone wrote the data files
    scored = {r: Path(f"{trace}.{r}").read_text().split() for r in (0, 1)}
    G, per_rank = 2, 2
    for step in range(2):
        mine = [set(scored[r][step * per_rank * G:(step + 1) * per_rank * G]) for r in (0, 1)]
        assert len(mine[0]) == len(mine[1]) == per_rank
        assert not mine[0] & mine[1]                 # disjoint prompts
    from transformers import AutoModelForImageTextToText

    start = AutoModelForImageTextToText.from_pretrained(tiny_vl).state_dict()
    final = AutoModelForImageTextToText.from_pretrained(run / "final").state_dict()
    assert any(not torch.equal(start[k], final[k]) for k in start)   # it trained
    assert figures["eval/n"] == 4 and figures == one_process(run)


def one_process(run: Path) -> dict:
    """The figures one process gets on the trained model and the held-out rows rank 0 wrote
    (one thread, as each torchrun rank has)."""
    from mmrlvr.api_eval import evaluate_model
    from mmrlvr.config import load_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return evaluate_model(load_config(run / "config.yaml"), run / "final",
                              str(run / "data" / "evaluate" / "eval.jsonl"))
    finally:
        torch.set_num_threads(threads)


EVAL_SCRIPT = '''
import json, os, sys
import yaml
from PIL import Image
from mmrlvr import GRPOConfig, GRPOTrainer
from mmrlvr.config import to_dict

def brief(completions, **kwargs):
    return [1.0 - min(len(c), 20) / 20 for c in completions]

if __name__ == "__main__":
    model, out = sys.argv[1:3]
    rows = [{"prompt": f"<image>How many squares? ({i})", "solution": str(i % 3 + 1),
             "image": Image.new("RGB", (56, 56), (30 * i, 100, 200 - 20 * i))} for i in range(4)]
    args = GRPOConfig(output_dir=out, max_completion_length=6, per_device_eval_batch_size=2,
                      report_to="none", use_cpu=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[brief], args=args, train_dataset=rows,
                          overrides=["model.min_pixels=3136", "model.max_pixels=3136"])
    figures = trainer.evaluate(rows)
    rank = os.environ.get("RANK", "0")
    with open(f"{out}.rank{rank}.json", "w") as fh:
        json.dump({"figures": figures, "world": os.environ.get("WORLD_SIZE")}, fh)
    if rank == "0":
        with open(f"{out}.config.yaml", "w") as fh:
            yaml.safe_dump(to_dict(trainer.args), fh)
'''
needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                      reason="accelerate is not installed")


def accelerate(*flags: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", *flags, "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


@needs_accelerate
def test_accelerate_launch_multi_gpu_runs_an_api_script_on_two_ranks_on_cpu(tmp_path, tiny_vl):
    """accelerate's --multi_gpu launcher is torchrun underneath: it sets RANK and WORLD_SIZE
    (gloo where there is no GPU), so an API script's evaluate runs on both ranks."""
    from mmrlvr.api_eval import evaluate_model
    from mmrlvr.config import load_config

    script, run = tmp_path / "eval.py", tmp_path / "run"
    script.write_text(EVAL_SCRIPT)
    run_ok([*accelerate("--multi_gpu", "--main_process_port", str(free_port())), str(script),
            str(tiny_vl), str(run)], env=env(PYTHONPATH=str(ROOT)), cwd=tmp_path)
    ranks = [json.loads(Path(f"{run}.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == ["2", "2"] and ranks[0] == ranks[1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = evaluate_model(load_config(f"{run}.config.yaml"), tiny_vl,
                             str(run / "data" / "evaluate" / "eval.jsonl"))
    finally:
        torch.set_num_threads(threads)
    assert ranks[0]["figures"] == one and one["eval/n"] == 4


@needs_accelerate
def test_accelerate_launch_cpu_starts_one_process_so_the_trainer_says_use_torchrun(tmp_path,
                                                                                  tiny_vl):
    """`accelerate launch --cpu --num_processes 2` starts ONE process and sets no RANK or
    WORLD_SIZE (accelerate's simple launcher): refused before anything is written, naming
    torchrun, instead of one process training the whole run as if there were two."""
    script, run = tmp_path / "eval.py", tmp_path / "run"
    script.write_text(EVAL_SCRIPT)
    out = subprocess.run([*accelerate("--cpu"), str(script), str(tiny_vl), str(run)],
                         capture_output=True, text=True, env=env(PYTHONPATH=str(ROOT)),
                         cwd=tmp_path, timeout=300)
    assert out.returncode != 0
    assert "accelerate launch --num_processes 2 started this script as one process" in out.stderr
    assert "torchrun --nproc_per_node 2 SCRIPT" in out.stderr and "--multi_gpu" in out.stderr
    assert not run.exists() and not Path(f"{run}.rank0.json").exists()
