"""Real multi-process runs on CPU (gloo): torchrun and accelerate launch, DDP and FSDP2.

Each test starts 2 processes of the real CLI (or of tests/mp_worker.py) on a tiny Qwen2.5-VL
and checks what the run itself recorded: its world size, which prompts each rank drew, that
the ranks' weights agree, that 2 processes make the update 1 process makes on the same batch,
and that a killed 2-process run resumes to the same metrics.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from mmrlvr.train.checkpoint import MARKER, latest_checkpoint
from mmrlvr.train.logger import read_metrics

HERE = Path(__file__).parent
VOLATILE = ("time/", "perf/")

# Writes one line per scored completion: which rank scored which example at which call.
TRACE_REWARD = '''
import json, os, time
def traced(example, completion):
    path = os.environ["MMRLVR_TRACE"] + f".rank{os.environ.get('RANK', '0')}"
    with open(path, "a") as fh:
        fh.write(json.dumps({"id": example.id, "pid": os.getpid()}) + "\\n")
    time.sleep(float(os.environ.get("MMRLVR_TRACE_SLEEP", "0")))
    return min(len(completion), 40) / 40.0
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", **extra}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]


def cli(*args: str) -> list[str]:
    return ["-m", "mmrlvr.cli", *args]


def write_config(tmp_path: Path, tiny_vl: Path, shapes_dir: Path, name: str, **sections) -> Path:
    (tmp_path / "traced.py").write_text(TRACE_REWARD)
    cfg = {
        "model": {"path": str(tiny_vl)},
        "data": {"train": str(shapes_dir / "train.jsonl"), "eval": str(shapes_dir / "test.jsonl"),
                 "eval_limit": 6},
        "rollout": {"group_size": 4, "max_new_tokens": 10, "temperature": 1.0},
        "optim": {"lr": 1e-3},
        "train": {"steps": 2, "batch_prompts": 4, "micro_batch": 4, "save_every": 0,
                  "out_dir": str(tmp_path / name), "seed": 5},
        "rewards": [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
                    {"name": str(tmp_path / "traced.py") + ":traced", "weight": 0.5}],
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value) if isinstance(value, dict) else cfg.update({key: value})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_ok(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


def traced_ids(trace: Path) -> dict[int, list[str]]:
    """Example ids each rank scored, in order (G lines per prompt)."""
    out = {}
    for rank in (0, 1):
        lines = Path(f"{trace}.rank{rank}").read_text().splitlines()
        out[rank] = [json.loads(ln)["id"] for ln in lines]
    return out


def stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_torchrun_ddp_run_is_two_ranks_with_disjoint_prompts_and_equal_weights(
        tmp_path, tiny_vl, shapes_dir):
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "ddp", train={"save_every": 1})
    trace = tmp_path / "trace"
    run_ok(torchrun(*cli("train", str(cfg))), env=env(MMRLVR_TRACE=str(trace)))
    run = tmp_path / "ddp"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp"
    assert summary["ranks_in_sync"] is True          # every rank's weights fingerprinted equal
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[0]["run/world_size"] == 2 and [r["step"] for r in rows] == [0, 1, 2]
    ids = traced_ids(trace)
    G, B = 4, 4
    for step in range(2):
        # each rank scored G completions of each of its B/2 prompts per step
        mine = [set(ids[r][step * B // 2 * G:(step + 1) * B // 2 * G]) for r in (0, 1)]
        assert len(mine[0]) == len(mine[1]) == B // 2
        assert not mine[0] & mine[1]                 # disjoint prompts
    for step in (1, 2):
        assert (run / "checkpoints" / f"step-{step}" / MARKER).is_file()
    from transformers import AutoModelForImageTextToText
    AutoModelForImageTextToText.from_pretrained(run / "final")


def test_accelerate_launch_starts_two_processes(tmp_path, tiny_vl, shapes_dir):
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "acc")
    run_ok([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
            "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            *cli("train", str(cfg))], env=env(MMRLVR_TRACE=str(tmp_path / "trace")))
    summary = json.loads((tmp_path / "acc" / "summary.json").read_text())
    assert summary["world_size"] == 2, summary


def worker_updates(tmp_path: Path, cases: dict[str, tuple[Path, Path]], limit: float
                   ) -> dict[str, tuple[dict, dict]]:
    """tests/mp_worker.py on every case ({name: (1-process config, 2-process config)}): all the
    cases in one process, then all in one `torchrun` launch (one import of torch and
    transformers per process for the lot); a launch that has no result after `limit` s per
    case (deadlocked ranks) fails. {name: (the 1-process record, the 2-process record)}."""
    e = env(MMRLVR_TRACE=str(tmp_path / "trace"), PYTHONPATH=str(HERE.parent))
    one = [a for name, (cfg, _) in cases.items() for a in (str(cfg), str(tmp_path / f"{name}-one.pt"))]
    two = [a for name, (_, cfg) in cases.items() for a in (str(cfg), str(tmp_path / f"{name}-two.pt"))]
    run_within([sys.executable, str(HERE / "mp_worker.py"), *one], limit * len(cases), env=e)
    run_within(torchrun(str(HERE / "mp_worker.py"), *two), limit * len(cases), env=e)
    return {name: (torch.load(tmp_path / f"{name}-one.pt"), torch.load(tmp_path / f"{name}-two.pt"))
            for name in cases}


def test_two_processes_make_the_update_one_process_makes(tmp_path, tiny_vl, shapes_dir):
    """DDP and FSDP2, each without and with `packing`: with it, the two processes pack their
    groups (`train.packing`; under FSDP2 with gradient checkpointing too, as a 7B run would)
    and the one process runs padded micro-batches: the same update either way."""
    cases = {}
    for strategy in ("ddp", "fsdp2"):
        for packing in (False, True):
            name = f"{strategy}-packing{int(packing)}"
            cases[name] = (
                write_config(tmp_path, tiny_vl, shapes_dir, f"{name}-1", train={"strategy": strategy},
                             optim={"max_grad_norm": 0.0}),
                write_config(tmp_path, tiny_vl, shapes_dir, f"{name}-2",
                             train={"strategy": strategy, "packing": packing},
                             model={"gradient_checkpointing": packing and strategy == "fsdp2"},
                             optim={"max_grad_norm": 0.0}))
    for name, (one, two) in worker_updates(tmp_path, cases, 180).items():
        strategy = name.split("-")[0]
        assert (one["world"], two["world"], two["strategy"]) == (1, 2, strategy), name
        assert torch.equal(one["rewards"], two["rewards"]), name    # the same rollouts scored
        if name.endswith("packing1"):                # rank 0's packs ran less padding
            assert two["padded_frac"] < one["padded_frac"], (name, two["padded_frac"],
                                                             one["padded_frac"])
        assert_same_update(one, two, name)


def assert_same_update(one: dict, two: dict, case: str = "") -> None:
    """The 2-process update (mp_worker's record) is the 1-process update of the whole batch."""
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7), case
    assert one["grads"].keys() == two["grads"].keys() and len(one["grads"]) > 20, case
    for name, g in one["grads"].items():
        # summed over ranks with the global token count: the whole batch's gradient; fp32 sums
        # in another order differ by ~1e-7 of their largest term (Gemma's projector: 1e3)
        atol = max(1e-6, 1e-6 * float(g.abs().max()))
        torch.testing.assert_close(two["grads"][name], g, rtol=1e-4, atol=atol,
                                   msg=f"{case}: {name}")
    for name, w in one["after"].items():
        if name not in one["grads"]:       # a part no row reaches (an Omni thinker's vision)
            assert torch.equal(two["after"][name], w), f"{case}: {name}"
            continue
        # Adam's first step is about lr·sign(g): compare where the gradient is not ~0
        clear = one["grads"][name].abs() > 1e-5
        torch.testing.assert_close(two["after"][name][clear], w[clear], rtol=1e-5, atol=1e-6,
                                   msg=f"{case}: {name}")


def run_within(cmd: list[str], timeout: float, **kw) -> None:
    """Run `cmd` in its own process group; past `timeout` s (a deadlock) kill the group, fail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{' '.join(cmd[-2:])}: no result after {timeout:.0f} s (deadlocked ranks?)")
    assert proc.returncode == 0, err[-4000:]


def text_rank_case(tmp_path: Path, name: str, model: Path, shapes_dir: Path, strategy: str,
                   beta: float = 0.0, data: Path | None = None, batch: int = 2,
                   modality: str = "vision") -> tuple[Path, Path]:
    """The configs of one case where rank 0 trains an image prompt's group and rank 1 a
    text-only one (mp_worker: rank r gets rows r, r + 2, ...; `data` replaces the two rows)."""
    from tests.test_text_only import write_rows

    data = data or write_rows(tmp_path, shapes_dir, ["image", "text"])
    sections = dict(data={"train": str(data), "eval": "", "allow_outside": True, "max_frames": 8,
                          "video_fps": 4.0},
                    train={"strategy": strategy, "batch_prompts": batch, "steps": 1},
                    algo={"beta": beta}, optim={"max_grad_norm": 0.0},
                    model={"modality": modality})
    return (write_config(tmp_path, model, shapes_dir, f"{name}-one", **sections),
            write_config(tmp_path, model, shapes_dir, f"{name}-two", **sections))


def assert_text_rank_updates(tmp_path: Path, cases: dict[str, tuple[Path, Path]],
                             limit: float = 180) -> None:
    """Every case's 2-process run ends (a deadlock fails it) and makes the update one process
    makes on all the prompts."""
    for name, (one, two) in worker_updates(tmp_path, cases, limit).items():
        strategy = yaml.safe_load(cases[name][1].read_text())["train"]["strategy"]
        assert (two["world"], two["strategy"]) == (2, strategy), name
        assert torch.equal(one["rewards"], two["rewards"]), name
        assert_same_update(one, two, name)


def test_a_rank_with_only_text_prompts_keeps_step_with_an_image_rank(tmp_path, tiny_vl, shapes_dir):
    """Under FSDP2 the vision tower is a sharded unit of its own, so the text-only rank runs it
    on a dummy image whose features count 0 (its all-gathers and reduce-scatters must match the
    image rank's), in the sharded reference's no-grad forwards too (`beta`); DDP finds the
    unused tower parameters itself."""
    assert_text_rank_updates(tmp_path, {
        f"{strategy}-beta{beta}": text_rank_case(tmp_path, f"{strategy}-beta{beta}", tiny_vl,
                                                 shapes_dir, strategy, beta)
        for strategy, beta in (("ddp", 0.0), ("fsdp2", 0.04))}, limit=120)


def test_fsdp2_on_new_families_with_a_text_only_rank_makes_one_process_update(
        tmp_path_factory, tmp_path, shapes_dir):
    """A MoE family (its expert blocks units of their own, inside their layers; DeepStack mergers
    in the tower), tiled ones (Gemma's SigLIP tower and projector, InternVL's tower and
    projector) and Qwen3.5's hybrid (Gated DeltaNet layers beside full attention): the text-only
    rank runs their towers on the family's dummy input."""
    from mmrlvr.tiny import build_tiny

    cases = {}
    for kind in ("qwen3-vl-moe", "gemma3", "internvl", "qwen3.5"):
        model = build_tiny(kind, tmp_path_factory.mktemp(kind.replace(".", "")))
        cases[kind] = text_rank_case(tmp_path, kind, model, shapes_dir, "fsdp2")
    assert_text_rank_updates(tmp_path, cases)


def test_audio_families_with_a_text_only_rank_make_one_process_update(
        tmp_path_factory, tmp_path, shapes_dir):
    """Rank 0 trains a clip's group, rank 1 a text-only prompt's: under FSDP2 the text rank runs
    the audio tower on the family's dummy clip (its collectives must match the audio rank's);
    under DDP it leaves the tower unused. Either way the update is the one process's."""
    from mmrlvr.tasks.tones import make_tones
    from mmrlvr.tiny import build_tiny
    from tests.test_text_only import TEXT_ROWS

    tones = tmp_path / "tones"
    make_tones(tones, n_train=2, n_test=0, seed=0)
    clips = [json.loads(line) for line in (tones / "train.jsonl").read_text().splitlines()]
    rows = [dict(clips[0], audios=[str(tones / p) for p in clips[0]["audios"]]), TEXT_ROWS[0]]
    data = tmp_path / "audio_text.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cases = {}
    for kind, strategy in (("qwen2-audio", "fsdp2"), ("qwen2.5-omni", "ddp"), ("qwen3-omni", "fsdp2")):
        model = build_tiny(kind, tmp_path_factory.mktemp(kind.replace(".", "")))
        cases[f"{kind}-{strategy}"] = text_rank_case(tmp_path, f"{kind}-{strategy}", model,
                                                     shapes_dir, strategy, data=data,
                                                     modality="audio")
    assert_text_rank_updates(tmp_path, cases)


def test_fsdp2_on_video_image_and_interleaved_rows_with_a_text_only_rank(
        tmp_path_factory, tmp_path, shapes_dir):
    """One dataset of video, image, two-image interleaved and text-only rows: rank 0's share is
    a video, an image and a two-image row, rank 1's all text; the video tower (the vision tower
    on `pixel_values_videos`) and the dummy-tower path meet in the same collectives."""
    from mmrlvr.tiny import build_tiny
    from tests.test_video import write_rank_rows

    data = write_rank_rows(tmp_path)
    cases = {}
    for kind in ("qwen2.5-vl", "qwen3-vl"):
        model = build_tiny(kind, tmp_path_factory.mktemp(kind.replace(".", "")))
        cases[kind] = text_rank_case(tmp_path, kind, model, shapes_dir, "fsdp2", data=data, batch=6)
    assert_text_rank_updates(tmp_path, cases)


def test_fsdp2_in_bf16_moves_every_fp32_master_weight_at_lr_1e_6(tmp_path, tiny_vl, shapes_dir):
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "bf16", train={"strategy": "fsdp2"},
                       model={"dtype": "bfloat16"}, optim={"lr": 1e-6})
    e = env(MMRLVR_TRACE=str(tmp_path / "trace"), PYTHONPATH=str(HERE.parent))
    run_ok(torchrun(str(HERE / "mp_worker.py"), str(cfg), str(tmp_path / "two.pt")), env=e)
    two = torch.load(tmp_path / "two.pt")
    assert two["strategy"] == "fsdp2"
    assert all(w.dtype == torch.float32 for w in two["after"].values())
    assert two["changed"] >= 0.99, two["changed"]


def test_fsdp2_run_saves_sharded_checkpoints_and_resumes_identically(tmp_path, tiny_vl, shapes_dir):
    common = dict(train={"strategy": "fsdp2", "steps": 3, "save_every": 2},
                  optim={"lr": 1e-3, "schedule": "constant"})
    e = env(MMRLVR_TRACE=str(tmp_path / "trace"))
    ref = write_config(tmp_path, tiny_vl, shapes_dir, "whole", **common)
    run_ok(torchrun(*cli("train", str(ref))), env=e)
    cut = write_config(tmp_path, tiny_vl, shapes_dir, "cut", **common)
    run_ok(torchrun(*cli("train", str(cut), "train.steps=2")), env=e)
    ckpt = tmp_path / "cut" / "checkpoints" / "step-2"
    assert (ckpt / MARKER).is_file() and (ckpt / "sharded" / ".metadata").is_file()
    assert len(list((ckpt / "sharded").glob("*.distcp"))) == 2       # one shard per rank
    from transformers import AutoModelForImageTextToText
    AutoModelForImageTextToText.from_pretrained(ckpt)                # gathered, HF-loadable
    run_ok(torchrun(*cli("train", "--resume", str(tmp_path / "cut"), "train.steps=3")), env=e)
    whole = stable(read_metrics(tmp_path / "whole" / "metrics.jsonl"))
    resumed = stable(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    assert resumed[3] == whole[3]
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert (summary["world_size"], summary["strategy"]) == (2, "fsdp2")


def test_kill_9_of_one_rank_then_resume_continues_identically(tmp_path, tiny_vl, shapes_dir):
    common = dict(train={"steps": 5, "save_every": 2})
    trace = tmp_path / "trace"
    e = env(MMRLVR_TRACE=str(trace))
    slow = env(MMRLVR_TRACE=str(trace), MMRLVR_TRACE_SLEEP="0.1")   # only the run to be killed
    ref = write_config(tmp_path, tiny_vl, shapes_dir, "uninterrupted", **common)
    run_ok(torchrun(*cli("train", str(ref))), env=e)
    reference = stable(read_metrics(tmp_path / "uninterrupted" / "metrics.jsonl"))

    for rank in (0, 1):
        Path(f"{trace}.rank{rank}").unlink()
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "killed", **common)
    run = tmp_path / "killed"
    proc = subprocess.Popen(torchrun(*cli("train", str(cfg))), env=slow,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
        if steps and max(steps) >= 3:
            break
        time.sleep(0.05)
    pid = json.loads(Path(f"{trace}.rank1").read_text().splitlines()[-1])["pid"]
    os.kill(pid, signal.SIGKILL)                          # one rank dies; torchrun stops the rest
    proc.wait(timeout=120)
    assert proc.returncode != 0, "the run finished before it could be killed"
    assert latest_checkpoint(run).name in ("step-2", "step-4")
    run_ok(torchrun(*cli("train", "--resume", str(run))), env=e)
    resumed = stable(read_metrics(run / "metrics.jsonl"))
    assert [r["step"] for r in resumed] == list(range(6))
    assert resumed == reference


def test_sft_on_two_processes_matches_one_process(tmp_path, tiny_vl, shapes_dir):
    results = {}
    for name, launch in (("one", lambda c: [sys.executable, *c]), ("two", lambda c: torchrun(*c))):
        cfg = write_config(tmp_path, tiny_vl, shapes_dir, name,
                           sft={"init": str(tiny_vl), "steps": 2, "batch_size": 8, "lr": 1e-3,
                                "warmup_steps": 0, "out_dir": str(tmp_path / f"sft-{name}")},
                           data={"eval": ""}, train={"micro_batch": 2})
        run_ok(launch(cli("sft", str(cfg))), env=env())
        results[name] = read_metrics(tmp_path / f"sft-{name}" / "metrics.jsonl")
    summary = json.loads((tmp_path / "sft-two" / "summary.json").read_text())
    assert summary["world_size"] == 2
    for a, b in zip(results["one"], results["two"], strict=True):
        # the loss and the gradient norm are the whole batch's on both
        assert b["sft/loss"] == pytest.approx(a["sft/loss"], rel=1e-5)
        assert b["optim/grad_norm"] == pytest.approx(a["optim/grad_norm"], rel=1e-4)
    from safetensors.torch import load_file
    one = load_file(tmp_path / "sft-one" / "final" / "model.safetensors")
    two = load_file(tmp_path / "sft-two" / "final" / "model.safetensors")
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)


def test_batch_that_does_not_divide_over_the_processes_is_refused(tmp_path, tiny_vl, shapes_dir):
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "odd", train={"batch_prompts": 3})
    out = subprocess.run(torchrun(*cli("train", str(cfg))), capture_output=True, text=True,
                         env=env(), timeout=300)
    assert out.returncode != 0
    assert "train.batch_prompts (3) must divide evenly over the 2 processes" in out.stderr
    assert not (tmp_path / "odd").exists()          # refused before anything was written


def test_deepspeed_through_accelerate_is_refused_before_loading(tmp_path, tiny_vl, shapes_dir):
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "ds")
    out = subprocess.run([sys.executable, *cli("train", str(cfg))], capture_output=True,
                         text=True, env=env(ACCELERATE_USE_DEEPSPEED="true"), timeout=120)
    assert out.returncode == 2
    assert "DeepSpeed is not supported" in out.stderr and "fsdp2" in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                    reason="accelerate is not installed")
def test_mmrlvr_train_started_alone_by_accelerate_from_a_config_file_is_refused(
        tmp_path, tiny_vl, shapes_dir):
    """`accelerate launch --config_file F -m mmrlvr.cli train` with F's num_processes: 2 and no
    --multi_gpu starts ONE process with no RANK or WORLD_SIZE: `mmrlvr train` refuses it before
    the run dir exists, naming the count from the file, torchrun and --multi_gpu."""
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "lone")
    launch = tmp_path / "accelerate.yaml"
    launch.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "use_cpu": True,
                                      "distributed_type": "MULTI_CPU", "num_processes": 2,
                                      "num_machines": 1, "mixed_precision": "no",
                                      "dynamo_backend": "NO"}))
    out = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                          str(launch), "-m", "mmrlvr.cli", "train", str(cfg)],
                         capture_output=True, text=True, env=env(), timeout=300)
    assert out.returncode != 0
    assert "accelerate launch --num_processes 2 started this script as one process" in out.stderr
    assert "torchrun --nproc_per_node 2" in out.stderr and "--multi_gpu" in out.stderr
    assert not (tmp_path / "lone").exists()


@pytest.mark.parametrize("strategy, teacher", [("ddp", "live"), ("fsdp2", "frozen")])
def test_sft_then_pwsd_on_two_processes(tmp_path, tiny_vl, strategy, teacher):
    from mmrlvr.tasks.banners import make_banners

    data = tmp_path / "banners"
    make_banners(data, n_train=8, n_test=0, width=112, height=56, seed=1)
    cfg = {"model": {"path": str(tiny_vl), "modality": "image_translation"},
           "data": {"train": str(data / "train.jsonl")},
           "rollout": {"group_size": 2, "max_new_tokens": 8},
           "rewards": [{"name": "translation", "weight": 1.0}],
           "train": {"strategy": strategy, "micro_batch": 4},
           "sft": {"init": str(tiny_vl), "steps": 1, "batch_size": 4, "privileged_fraction": 0.5,
                   "out_dir": str(tmp_path / "sft"),
                   "pwsd": {"steps": 2, "batch_prompts": 2, "group_size": 2, "max_rows": 4,
                            "teacher": teacher, "out_dir": str(tmp_path / "pwsd")}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_ok(torchrun(*cli("sft", str(path))), env=env())
    for stage in ("sft", "pwsd"):
        summary = json.loads((tmp_path / stage / "summary.json").read_text())
        assert (summary["world_size"], summary["strategy"]) == (2, strategy), stage
    rows = read_metrics(tmp_path / "pwsd" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["objective/pwsd/rows"] > 0 and r["objective/pwsd"] >= 0 for r in rows)
    from transformers import AutoModelForImageTextToText
    AutoModelForImageTextToText.from_pretrained(tmp_path / "pwsd" / "final")


def test_fsdp2_sft_with_a_text_only_share_matches_one_process(tmp_path, tiny_vl, shapes_dir):
    """SFT draws both rows of an image + text file each step, so one rank trains the image row
    and the other the text row: under FSDP2 the run ends, with one process's loss and norm."""
    from tests.test_text_only import write_rows

    data = write_rows(tmp_path, shapes_dir, ["image", "text"])
    results = {}
    for name, launch in (("one", lambda c: [sys.executable, *c]), ("two", lambda c: torchrun(*c))):
        cfg = write_config(tmp_path, tiny_vl, shapes_dir, name,
                           sft={"init": str(tiny_vl), "steps": 2, "batch_size": 2, "lr": 1e-3,
                                "warmup_steps": 0, "out_dir": str(tmp_path / f"sft-{name}")},
                           data={"train": str(data), "eval": "", "allow_outside": True},
                           train={"strategy": "fsdp2", "micro_batch": 1})
        run_within(launch(cli("sft", str(cfg))), 120, env=env())
        results[name] = read_metrics(tmp_path / f"sft-{name}" / "metrics.jsonl")
    for a, b in zip(results["one"], results["two"], strict=True):
        assert b["sft/loss"] == pytest.approx(a["sft/loss"], rel=1e-5)
        assert b["optim/grad_norm"] == pytest.approx(a["optim/grad_norm"], rel=1e-4)


def test_dynamic_sampling_under_two_processes_keeps_the_ranks_in_step(tmp_path, tiny_vl,
                                                                      shapes_dir):
    """Ranks short of spread groups draw again while any is short (a generate under FSDP2 is a
    collective), then fill to one share each: the run ends, every step's groups have spread."""
    from tests.test_toolkit import HALF_SPREAD

    (tmp_path / "half.py").write_text(HALF_SPREAD)
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "dyn",
                       train={"strategy": "fsdp2", "dynamic_sampling": True,
                              "dynamic_max_draws": 6, "eval_every": 0},
                       data={"eval": ""}, rewards=[{"name": str(tmp_path / "half.py") + ":half"}])
    run_ok(torchrun(*cli("train", str(cfg))), env=env())
    rows = [json.loads(line) for line in (tmp_path / "dyn" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "sampling/draws" in r]
    assert len(steps) == 2 and all(r["reward/zero_spread_frac"] == 0.0 for r in steps), steps


def test_sigterm_under_two_processes_stops_both_ranks_after_one_step_with_a_checkpoint(
        tmp_path, tiny_vl, shapes_dir):
    """torchrun passes SIGTERM on to each rank, each at its own moment: the ranks agree after a
    step, save that step together (FSDP2: a sharded checkpoint) and end."""
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "pre", data={"eval": ""},
                       train={"strategy": "fsdp2", "steps": 200, "save_every": 0})
    proc = subprocess.Popen(torchrun(*cli("train", str(cfg))), text=True,
                            env=env(MMRLVR_TRACE=str(tmp_path / "trace")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = tmp_path / "pre" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    steps = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "pre" / "checkpoints").glob("step-*"))
    assert len(steps) == 1 and 1 <= steps[0] < 200, err[-3000:]
    assert f"SIGTERM: stopped after step {steps[0]} of 200" in err, err[-3000:]
    assert (tmp_path / "pre" / "checkpoints" / f"step-{steps[0]}" / "sharded").is_dir()


def test_one_step_off_under_two_ddp_processes_trains_ahead_and_keeps_the_ranks_in_step(
        tmp_path, tiny_vl, shapes_dir):
    """DDP with `train.async_rollouts: one_step_off`: each rank generates its next share on a
    thread from its own behaviour copy while the update's all-reduce runs on the main thread;
    steps 2 and 3 train on batches generated ahead, and the ranks' weights end equal."""
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "async",
                       train={"steps": 3, "async_rollouts": "one_step_off", "threads": 1,
                              "eval_every": 0}, data={"eval": ""})
    run_ok(torchrun(*cli("train", str(cfg))), env=env(MMRLVR_TRACE=str(tmp_path / "trace")))
    run = tmp_path / "async"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    steps = [r for r in read_metrics(run / "metrics.jsonl") if "async/stale" in r]
    assert [r["async/stale"] for r in steps] == [0.0, 1.0, 1.0], steps
    assert all(r["optim/grad_norm"] > 0 for r in steps)
