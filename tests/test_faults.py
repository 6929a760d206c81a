"""Fault injection: a run either continues with the fault counted and its weights finite, or
stops with a message naming the cause — never a checkpoint of non-finite weights, never a
second run writing into a run dir, never a traceback for bad input.

(The verifier's complexity bombs: tests/test_verify_adversarial.py; bad media rows:
tests/test_data_media.py; bad config values: tests/test_config_checks.py; reward isolation in
detail: tests/test_reward_isolation.py. This module drives whole runs.)
"""
from __future__ import annotations

import errno
import json
import re
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from mmrlvr.train.checkpoint import MARKER, CheckpointError
from mmrlvr.config import load_config
from mmrlvr.core.errors import TrainingError
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.rundir import RunDirError
from mmrlvr.train.trainer import train
from rewards.base import RewardError

REWARDS = '''
import math, os, time
def length(example, completion):
    return min(len(completion), 40) / 40.0
def nan_some(example, completion):
    return float("nan") if len(completion) % 3 == 0 else 1.0
def inf_all(example, completion):
    return float("inf")
def raises(example, completion):
    if len(completion) % 2:
        raise KeyError("no field 'solution' in this example")
    return 0.5
def wrong_type(example, completion):
    return None if len(completion) % 2 else 0.5
def hangs_once(example, completion):
    if not HUNG:
        HUNG.append(1)
        time.sleep(3)
    return 1.0
HUNG = []
def slow_while_flagged(example, completion):
    if os.path.exists(os.path.join(os.path.dirname(__file__), "slow.flag")):
        time.sleep(0.1)
    return 1.0
def many_parts(example, completion):
    return {"overall": 0.5, **{f"part{i:03d}": 0.5 for i in range(200)}}
'''


def config(tmp_path: Path, tiny_vl: Path, shapes_dir: Path, name: str, extra_reward: str | None,
           **sections) -> Path:
    (tmp_path / "r.py").write_text(REWARDS)
    rewards = [{"name": "accuracy", "weight": 0.9},
               {"name": str(tmp_path / "r.py") + ":length", "weight": 0.5}]
    if extra_reward:
        rewards.append({"name": str(tmp_path / "r.py") + f":{extra_reward}", "weight": 1.0,
                        "timeout_s": 0.5})
    cfg = {"model": {"path": str(tiny_vl)},
           "data": {"train": str(shapes_dir / "train.jsonl")},
           "rollout": {"group_size": 4, "max_new_tokens": 8},
           "optim": {"lr": 1e-3},
           "train": {"steps": 2, "batch_prompts": 2, "micro_batch": 8, "save_every": 1,
                     "out_dir": str(tmp_path / name), "seed": 1},
           "rewards": rewards}
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", *args], capture_output=True,
                          text=True, timeout=600)


def weights_finite(model_dir: Path) -> bool:
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for t in load_file(model_dir / "model.safetensors").values())


@pytest.mark.parametrize("reward, kind", [("nan_some", "nonfinite"), ("raises", "error"),
                                          ("wrong_type", "type")])
def test_a_bad_reward_on_some_completions_is_counted_and_the_run_goes_on(
        tmp_path, tiny_vl, shapes_dir, reward, kind):
    summary = train(load_config(config(tmp_path, tiny_vl, shapes_dir, "run", reward)),
                    progress=False)
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and summary["steps"] == 2
    failed = [r[f"reward/{reward}/failed"] for r in rows]
    assert 0 < sum(failed) and all(f < 1 for f in failed)
    assert all(r["reward/mean"] is not None and math.isfinite(r["reward/mean"]) for r in rows)
    logged = [json.loads(ln) for ln in (run / "reward_errors.jsonl").read_text().splitlines()]
    assert logged and {e["reward"] for e in logged} == {reward} and logged[0]["kind"] == kind
    assert weights_finite(run / "final") and weights_finite(run / "checkpoints" / "step-2")


def test_a_reward_that_fails_on_every_completion_stops_the_run_with_its_traceback(
        tmp_path, tiny_vl, shapes_dir):
    out = cli("train", str(config(tmp_path, tiny_vl, shapes_dir, "run", "inf_all")))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "inf_all" in out.stderr and "Traceback (most recent call last)" not in out.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()   # stopped before any update


def test_a_reward_that_hangs_times_out_and_the_run_goes_on(tmp_path, tiny_vl, shapes_dir):
    t0 = time.perf_counter()
    train(load_config(config(tmp_path, tiny_vl, shapes_dir, "run", "hangs_once")), progress=False)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # its first call hung (3 s) past timeout_s 0.5: that completion scored the failure value
    assert rows[0]["reward/hangs_once/failed_timeout"] == pytest.approx(1 / 8)
    assert rows[1]["reward/hangs_once/failed"] == 0.0
    (logged,) = [json.loads(ln) for ln in
                 (tmp_path / "run" / "reward_errors.jsonl").read_text().splitlines()]
    assert logged["kind"] == "timeout" and logged["reward"] == "hangs_once"
    assert time.perf_counter() - t0 < 120


def test_a_non_finite_loss_skips_the_step_and_keeps_the_weights(tmp_path, tiny_vl, shapes_dir,
                                                                  monkeypatch):
    import mmrlvr.train.update as update

    real = update.grpo_loss
    calls = {"n": 0}

    def nan_on_first_step(*args, **kwargs):
        loss, st = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan"), st) if calls["n"] == 1 else (loss, st)

    monkeypatch.setattr(update, "grpo_loss", nan_on_first_step)
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, train={"steps": 2, "micro_batch": 64})
    train(load_config(path), progress=False)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[0]["update/skipped"] == 1.0 and "non-finite loss" in rows[0]["update/skip_cause"]
    assert rows[1]["update/skipped"] == 0.0
    from safetensors.torch import load_file
    start = load_file(Path(tiny_vl) / "model.safetensors")
    step1 = load_file(tmp_path / "run" / "checkpoints" / "step-1" / "model.safetensors")
    assert all(torch.equal(start[k], step1[k]) for k in start)    # the skipped step moved nothing
    assert weights_finite(tmp_path / "run" / "final")


def test_only_skipped_steps_stop_the_run_naming_the_first_cause(tmp_path, tiny_vl, shapes_dir,
                                                                 monkeypatch):
    import mmrlvr.train.update as update

    real = update.grpo_loss
    monkeypatch.setattr(update, "grpo_loss",
                        lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]))
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None,
                  train={"steps": 6, "max_skipped_steps": 2})
    with pytest.raises(TrainingError, match=r"2 steps in a row .*first at step 1: non-finite loss"):
        train(load_config(path), progress=False)
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 1    # the 2nd raised
    assert all(weights_finite(c) for c in (tmp_path / "run" / "checkpoints").glob("step-*"))


def test_an_infinite_lr_never_reaches_a_checkpoint(tmp_path, tiny_vl, shapes_dir):
    cfg = load_config(config(tmp_path, tiny_vl, shapes_dir, "run", None))
    cfg.optim.lr = float("inf")              # past config validation, as a programmatic user can
    with pytest.raises(TrainingError, match="made weights non-finite"):
        train(cfg, progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not (tmp_path / "run" / "final").exists()


def test_a_second_writer_on_a_run_dir_is_refused(tmp_path, tiny_vl, shapes_dir):
    # the first run is slow only until the second has been answered (slow.flag), so it is
    # surely still running when the second starts (4 steps at 1 s each once ended before the
    # second's imports did, and the second then overwrote its finished dir)
    (tmp_path / "slow.flag").touch()
    path = config(tmp_path, tiny_vl, shapes_dir, "run", "slow_while_flagged",
                  train={"steps": 40, "save_every": 20})
    first = subprocess.Popen([sys.executable, "-m", "mmrlvr.cli", "train", str(path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not read_metrics(tmp_path / "run" / "metrics.jsonl"):
        time.sleep(0.05)
    second = cli("train", str(path), "--overwrite")
    assert first.poll() is None, "the first run ended before the second started"
    (tmp_path / "slow.flag").unlink()
    first.wait(timeout=300)
    assert second.returncode == 2 and "is in use by pid" in second.stderr, second.stderr[-1500:]
    assert first.returncode == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 41))    # one run's metrics, untouched


def test_a_fresh_run_into_an_old_run_dir_needs_overwrite_and_resume_checks_the_model(
        tmp_path, tiny_vl, tiny_qwen2vl, shapes_dir):
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, train={"steps": 1})
    assert cli("train", str(path)).returncode == 0
    again = cli("train", str(path))
    assert again.returncode == 2
    assert "already holds a run" in again.stderr and "--resume" in again.stderr
    assert "--overwrite" in again.stderr and "Traceback" not in again.stderr
    assert cli("train", str(path), "--overwrite", "train.steps=2").returncode == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]                 # not appended to the old run
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-1", "step-2"]
    other = cli("train", "--resume", str(tmp_path / "run"), f"model.path={tiny_qwen2vl}",
                "train.steps=3")
    assert other.returncode == 2 and "model.path" in other.stderr and "--force" in other.stderr


def test_a_full_disk_is_named_before_a_checkpoint_is_written(tmp_path, tiny_vl, shapes_dir,
                                                             monkeypatch):
    import collections

    import mmrlvr.train.checkpoint as checkpoint

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(10 << 20, 9 << 20, 1 << 20))
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, train={"steps": 1})
    with pytest.raises(CheckpointError, match=r"no space left in .*checkpoints: a checkpoint needs "
                                              r"about [0-9,]+ MB, plus 64 MB kept free for the "
                                              r"run's logs, and 1 MB are free"):
        train(load_config(path), progress=False)
    assert not list((tmp_path / "run" / "checkpoints").glob("*step-1"))


def test_run_dir_errors_are_clear(tmp_path):
    from mmrlvr.train.rundir import claim

    lock = claim(tmp_path / "r", resume=False)
    with pytest.raises(RunDirError, match="in use by pid"):
        claim(tmp_path / "r", resume=False)
    lock.release()
    claim(tmp_path / "r", resume=False).release()


def test_a_bad_image_late_in_the_split_is_found_before_training(tmp_path, tiny_vl, shapes_dir):
    rows = (shapes_dir / "train.jsonl").read_text().splitlines()[:90]
    (shapes_dir / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)   # truncated
    late = json.loads(rows[85])
    late.update(id="late-bad", images=["broken.png"])
    rows[85] = json.dumps(late)
    data = shapes_dir / "late_bad.jsonl"
    data.write_text("\n".join(rows) + "\n")
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, data={"train": str(data)})
    out = cli("train", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "row 86" in out.stderr and "late-bad" in out.stderr and "on_error=skip" in out.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()          # nothing trained
    assert cli("train", str(path), "data.on_error=skip", "--overwrite").returncode == 0
    (skipped,) = [json.loads(ln) for ln in
                  (tmp_path / "run" / "skipped_rows.jsonl").read_text().splitlines()]
    assert skipped["id"] == "late-bad" and skipped["row"] == 86 and "broken.png" in skipped["reason"]
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["data/skipped_rows"] == 1


PLANTED = '''
import os, sys, torch
class Planted:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
torch.save({"step": 1, "payload": Planted()}, sys.argv[1])
'''


def _plant(tmp_path: Path, target: Path, marker: Path) -> None:
    (tmp_path / "plant.py").write_text(PLANTED)
    subprocess.run([sys.executable, str(tmp_path / "plant.py"), str(target), str(marker)],
                   check=True)


def test_resume_never_runs_code_planted_in_a_checkpoint(tmp_path, tiny_vl, shapes_dir):
    """A pickle with an `os.system` payload in `trainer_state.pt` is refused by name — whether
    the JSON beside it is there (new format) or not (old format, until --trust-checkpoint)."""
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, train={"steps": 2})
    assert cli("train", str(path)).returncode == 0
    step2 = tmp_path / "run" / "checkpoints" / "step-2"
    assert json.loads((step2 / "trainer_state.json").read_text())["format"] == 2
    marker = tmp_path / "pwned"
    _plant(tmp_path, step2 / "trainer_state.pt", marker)
    out = cli("train", "--resume", str(tmp_path / "run"), "train.steps=3")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-1500:]
    assert "trainer_state.pt holds more than tensors and was not loaded" in out.stderr
    assert not marker.exists()

    (step2 / "trainer_state.json").unlink()                  # an old-format checkpoint
    out = cli("train", "--resume", str(tmp_path / "run"), "train.steps=3")
    assert out.returncode == 2 and "old format, a Python pickle" in out.stderr
    assert "--trust-checkpoint" in out.stderr and not marker.exists()


def test_an_old_format_checkpoint_resumes_only_when_trusted_and_identically(
        tmp_path, tiny_vl, shapes_dir):
    """The pickled trainer state earlier releases wrote, read under --trust-checkpoint, continues
    exactly as the safe format does; the checkpoint after it is written in the safe format."""
    from mmrlvr.train.checkpoint import load_trainer_state

    def stable(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("time", "perf"))
                 and not k.endswith("_s")} for r in rows]

    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, train={"steps": 3})
    assert cli("train", str(path)).returncode == 0
    reference = stable(read_metrics(tmp_path / "run" / "metrics.jsonl"))
    step2 = tmp_path / "run" / "checkpoints" / "step-2"
    state = load_trainer_state(step2)
    for r in state["rng"]:                                    # as torch.save pickled it before
        py, npy = r["python"], r["numpy"]
        r["python"] = (py["version"], tuple(py["state"]), py["gauss"])
        r["numpy"] = (npy["name"], npy["key"].numpy().astype("uint32"), npy["pos"],
                      npy["has_gauss"], npy["cached"])
    torch.save(state, step2 / "trainer_state.pt")
    (step2 / "trainer_state.json").unlink()
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-3")    # resume from step 2
    refused = cli("train", "--resume", str(tmp_path / "run"))
    assert refused.returncode == 2 and "--trust-checkpoint" in refused.stderr
    out = cli("train", "--resume", str(tmp_path / "run"), "--trust-checkpoint")
    assert out.returncode == 0, out.stderr[-1500:]
    assert stable(read_metrics(tmp_path / "run" / "metrics.jsonl")) == reference
    assert (tmp_path / "run" / "checkpoints" / "step-3" / "trainer_state.json").is_file()


def test_an_lr_override_on_resume_is_applied_not_just_recorded(tmp_path, tiny_vl, shapes_dir):
    """`--resume RUN optim.lr=0.5`: config.yaml records 0.5 and the resumed steps run at 0.5
    (the checkpoint's optimizer had 1e-3); without the override they run at 1e-3 as before."""
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, train={"steps": 2},
                  optim={"schedule": "constant"})
    assert cli("train", str(path)).returncode == 0
    shutil.copytree(tmp_path / "run", tmp_path / "same")
    out = cli("train", "--resume", str(tmp_path / "run"), "train.steps=3", "optim.lr=0.5")
    assert out.returncode == 0, out.stderr[-1500:]
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["optim"]["lr"] == 0.5
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["optim/lr"] == 0.5
    assert cli("train", "--resume", str(tmp_path / "same"), "train.steps=3").returncode == 0
    assert read_metrics(tmp_path / "same" / "metrics.jsonl")[-1]["optim/lr"] == pytest.approx(1e-3)


class SmallDisk:
    """Where a run's files go, and a way to fill it up mid-run.

    A real tmpfs of `mb` MB mounted at `root` where this process may mount one (root, as on this
    machine and in CI's container): `fill` writes a ballast file until the kernel says ENOSPC,
    and every later write meets the full disk as it would in production. Where it may not, the
    same failures at the OS boundary only: after `fill`, an `os.write` to a file under `root`
    writes half its bytes (a full disk's short write) and its free space reads 0."""

    def __init__(self, root: Path, mb: int, monkeypatch):
        root.mkdir()
        self.root, self.full = root, False
        self.real = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(root)],
            capture_output=True).returncode == 0
        if not self.real:
            self._fake(monkeypatch)

    def fill(self) -> None:
        if not self.real:
            self.full = True
            return
        fd = os.open(self.root / "ballast", os.O_WRONLY | os.O_CREAT)
        try:
            for chunk in (1 << 20, 4096, 1):
                try:
                    while os.write(fd, b"\0" * chunk) == chunk:
                        pass
                except OSError as err:
                    assert err.errno == errno.ENOSPC
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.real:
            subprocess.run(["umount", "-l", str(self.root)], check=True)

    def _fake(self, monkeypatch) -> None:
        import collections

        real_write, real_usage = os.write, shutil.disk_usage
        under = lambda p: str(Path(p).resolve()).startswith(str(self.root.resolve()))

        def write(fd, data):
            if self.full and under(os.readlink(f"/proc/self/fd/{fd}")):
                return real_write(fd, bytes(data)[:len(data) // 2])
            return real_write(fd, data)

        def usage(path):
            got = real_usage(path)
            return collections.namedtuple("usage", "total used free")(
                got.total, got.total, 0) if self.full and under(path) else got

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(shutil, "disk_usage", usage)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    disk = SmallDisk(tmp_path / "disk", 128, monkeypatch)
    yield disk
    disk.close()


def _fill_after_saving(monkeypatch, disk: SmallDisk, step: int) -> None:
    """The disk fills right after checkpoint step-`step` is written (whole, marked complete)."""
    import mmrlvr.train.trainer as trainer

    real = trainer.save_checkpoint

    def save_then_fill(run_dir, at, *args, **kwargs):
        out = real(run_dir, at, *args, **kwargs)
        if at == step:
            disk.fill()
        return out

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_fill)


def _intact(run: Path, step: int) -> None:
    from mmrlvr.train.checkpoint import complete_checkpoints, load_trainer_state

    assert complete_checkpoints(run)[-1].name == f"step-{step}"
    assert load_trainer_state(run / "checkpoints" / f"step-{step}")["step"] == step
    assert weights_finite(run / "checkpoints" / f"step-{step}")


def test_a_disk_full_mid_run_stops_with_one_line_and_no_half_metrics_row(
        tmp_path, tiny_vl, shapes_dir, small_disk, monkeypatch):
    """The disk fills after step 1's checkpoint: step 2's metrics row (6 KB: a reward with 200
    components) meets it. One line names
    the dir, the bytes the row needed and the checkpoint to resume from; metrics.jsonl holds
    whole rows only (the part of step 2's row that fitted was cut back); no summary, no final/."""
    from mmrlvr.train.writes import WriteError

    _fill_after_saving(monkeypatch, small_disk, 1)
    cfg = load_config(config(tmp_path, tiny_vl, shapes_dir, "run", "many_parts",
                             train={"out_dir": str(small_disk.root / "run"), "report_to": []}))
    run = small_disk.root / "run"
    with pytest.raises(WriteError) as error:
        train(cfg, progress=False)
    message = str(error.value)
    assert "\n" not in message and f"cannot write metrics.jsonl in {run}: no space left" in message
    assert "it needed" in message and "KB" in message and "free there" in message
    assert "checkpoints/step-1, is intact" in message and f"--resume {run}" in message
    lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and [json.loads(line)["step"] for line in lines[:-1]] == [1]
    assert len(lines[0]) > 4096     # a row past a page: the full tmpfs took part of step 2's
    assert not (run / "summary.json").exists() and not (run / "final").exists()
    _intact(run, 1)


def test_an_sft_run_on_a_full_disk_leaves_no_final_and_no_summary(tmp_path, tiny_vl, shapes_dir,
                                                                  small_disk, monkeypatch):
    """mmrlvr sft saves final/ as a GRPO run does: space-checked, renamed in whole, before
    summary.json. The disk fills before it: one line naming the dir and what to do (sft keeps
    no checkpoints), no final/ for GRPO to start from, no summary saying the run finished."""
    import mmrlvr.train.sft as sft_module
    from mmrlvr.train.writes import WriteError

    real = sft_module.save_final

    def fill_then_save(*args, **kwargs):
        small_disk.fill()
        return real(*args, **kwargs)

    monkeypatch.setattr(sft_module, "save_final", fill_then_save)
    run = small_disk.root / "sft"
    cfg = load_config(config(tmp_path, tiny_vl, shapes_dir, "run", None,
                             sft={"init": str(tiny_vl), "steps": 1, "batch_size": 4,
                                  "out_dir": str(run)}, train={"report_to": []}))
    with pytest.raises(WriteError, match=rf"no space left in {run}: the final model needs about "
                                         r"\d+ MB, plus 64 MB kept free.*\. mmrlvr sft keeps "
                                         r"no checkpoints: rerun it once there is room\.$"):
        sft_module.sft(cfg, progress=False)
    assert not (run / "final").exists() and not (run / ".tmp-final").exists()
    assert not (run / "summary.json").exists() and not (run / "report.md").exists()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]


def test_a_disk_full_before_final_leaves_no_final_and_no_finished_summary(
        tmp_path, tiny_vl, shapes_dir, small_disk, monkeypatch):
    """Filled after the last checkpoint: final/ is refused by its space check (it left only a
    config.json once, while summary.json said the run had finished)."""
    from mmrlvr.train.writes import WriteError

    _fill_after_saving(monkeypatch, small_disk, 1)
    cfg = load_config(config(tmp_path, tiny_vl, shapes_dir, "run", None,
                             train={"out_dir": str(small_disk.root / "run"), "steps": 1,
                                    "report_to": []}))
    run = small_disk.root / "run"
    with pytest.raises(WriteError, match=rf"no space left in {run}: the final model needs about "
                                         r"\d+ MB, plus 64 MB kept free"):
        train(cfg, progress=False)
    assert not (run / "final").exists() and not (run / ".tmp-final").exists()
    assert not (run / "summary.json").exists() and not (run / "report.md").exists()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]
    _intact(run, 1)


def test_a_write_cut_short_by_the_disk_leaves_the_old_file_or_nothing(small_disk):
    """The write itself fails (the space check passed): a checkpoint or final/ whose model save
    wrote config.json, then ran out of space, leaves nothing (the earlier checkpoint intact);
    write_atomic keeps the previous report; append_line keeps whole lines."""
    from mmrlvr.train.checkpoint import complete_checkpoints, save_checkpoint
    from mmrlvr.train.writes import WriteError, append_line, save_final, write_atomic

    run = small_disk.root / "run"
    run.mkdir()
    write_atomic(run / "report.md", "old report\n")
    append_line(run / "metrics.jsonl", '{"step": 1}\n')

    class Policy:                                  # a model save of `mb` MB
        model = torch.nn.Linear(4, 4)

        def __init__(self, mb):
            self.mb = mb

        def save(self, out, main=True):
            out.mkdir(exist_ok=True)
            (out / "config.json").write_text("{}")
            (out / "model.safetensors").write_bytes(bytes(self.mb << 20))

    if not small_disk.real:
        pytest.skip("needs a real small filesystem (a tmpfs: root): the model save writes "
                    "through Python's file objects, not a patched os.write")
    save_checkpoint(run, 1, Policy(1), {"step": 1})
    with pytest.raises(CheckpointError, match=r"cannot write step-2 in .*: no space left .*the "
                                              r"partial checkpoint was removed"):
        save_checkpoint(run, 2, Policy(150), {"step": 2})
    assert [c.name for c in complete_checkpoints(run)] == ["step-1"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]
    with pytest.raises(WriteError, match=rf"cannot write final in {run}: no space left"):
        save_final(run, Policy(150))
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "report.md"]
    small_disk.fill()
    with pytest.raises(WriteError, match=r"cannot write report.md .*no space left .*it needed "
                                         r"1.0 MB"):
        write_atomic(run / "report.md", "x" * (1 << 20))
    with pytest.raises(WriteError, match="cannot write metrics.jsonl"):
        append_line(run / "metrics.jsonl", json.dumps({"step": 2, "pad": "x" * 20000}) + "\n")
    assert (run / "report.md").read_text() == "old report\n"
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "report.md"]


def test_an_absurd_lr_is_refused_before_anything_loads():
    """lr 1e30 was accepted and trained to weights of 2e29 in a checkpoint marked complete."""
    from mmrlvr.config import Config, find_problems

    cfg = Config()
    cfg.optim.lr, cfg.sft.lr = 1e30, 2.0
    problems = find_problems(cfg)
    assert any(p.startswith("config key 'optim.lr' is 1e+30, above 1: an AdamW step") and
               "e.g. 1e-6 for a 7B model" in p for p in problems), problems
    assert any(p.startswith("config key 'sft.lr' is 2.0, above 1") for p in problems)
    cfg.optim.lr, cfg.sft.lr = 0.5, 1e-5                  # high, but a learning rate
    assert not [p for p in find_problems(cfg) if "lr'" in p]


def test_a_cut_short_or_nan_weight_file_is_named_at_load(tmp_path, tiny_vl):
    """A truncated model.safetensors gave safetensors' "incomplete metadata" traceback; NaN
    weights loaded silently and failed the first rollout inside torch.multinomial."""
    from safetensors.torch import load_file, save_file

    from mmrlvr.train.policy import PolicyError, load_model

    cut, nan = tmp_path / "cut", tmp_path / "nan"
    shutil.copytree(tiny_vl, cut)
    shutil.copytree(tiny_vl, nan)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(PolicyError, match=rf"{cut}/model.safetensors is not a whole safetensors "
                                          r"file \(its header lists [\d,]+ bytes of data and the "
                                          r"file has [\d,]+\): it was cut short"):
        load_model(str(cut), torch.float32)
    weights = load_file(nan / "model.safetensors")
    weights["model.layers.0.mlp.up_proj.weight"][3, 5] = float("inf")
    save_file(weights, nan / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(PolicyError, match=rf"its weights hold NaN or inf values: "
                                          rf"{nan}/model.safetensors: tensor "
                                          r"'model.layers.0.mlp.up_proj.weight' \(1 of [\d,]+ "
                                          r"values\)"):
        load_model(str(nan), torch.float32)
    assert load_model(str(tiny_vl), torch.float32) is not None          # the original loads


def test_a_bom_data_file_loads_and_a_fake_parquet_is_named(tmp_path, shapes_dir):
    """A UTF-8 BOM (Excel, Notepad) failed at row 1; a .parquet that is not one gave pyarrow's
    ArrowInvalid traceback."""
    from mmrlvr.data import DataError, load_dataset

    rows = (shapes_dir / "train.jsonl").read_text().splitlines()[:3]
    (tmp_path / "images").mkdir()
    for row in rows:
        for image in json.loads(row)["images"]:
            shutil.copy(shapes_dir / image, tmp_path / image)
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode() + b"\n")
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf[" + ",".join(rows).encode() + b"]")
    plain = load_dataset(shapes_dir / "train.jsonl")[:3]
    for name in ("bom.jsonl", "bom.json"):
        loaded = load_dataset(tmp_path / name)
        assert [(e.id, e.prompt, e.answer) for e in loaded] == \
            [(e.id, e.prompt, e.answer) for e in plain], name
    (tmp_path / "fake.parquet").write_text('{"prompt": "q", "answer": "1"}\n')
    with pytest.raises(DataError, match=rf"{tmp_path}/fake.parquet: not a readable parquet file "
                                        r"\(Parquet magic bytes not found"):
        load_dataset(tmp_path / "fake.parquet")


def test_force_records_what_it_changed_and_overwrite_leaves_no_old_eval_records(tmp_path):
    """`--resume --force` with another model.path rewrote config.yaml and kept no trace of the
    run's start; `--overwrite` kept the old run's eval/step-N.jsonl beside the new run's."""
    from mmrlvr.train.rundir import FORCED, claim

    run = tmp_path / "run"
    (run / "checkpoints" / "step-4").mkdir(parents=True)
    for name in (MARKER, "trainer_state.pt"):                # what makes a checkpoint complete
        (run / "checkpoints" / "step-4" / name).write_text("step 4\n")
    started = {"model": {"path": "/models/a"}, "data": {"train": "t.jsonl"}}
    (run / "config.yaml").write_text(yaml.safe_dump(started))
    other = {"model": {"path": "/models/b"}, "data": {"train": "t.jsonl"}}
    with pytest.raises(RunDirError, match=r"model.path: '/models/a' -> '/models/b'.*--force"):
        claim(run, resume=True, cfg=other)
    assert not (run / FORCED).exists()
    claim(run, resume=True, force=True, cfg=other).release()
    (record,) = [json.loads(line) for line in (run / FORCED).read_text().splitlines()]
    assert record["changed"] == {"model.path": ["/models/a", "/models/b"]}
    assert record["from_checkpoint"] == "step-4"
    assert yaml.safe_load(record["replaced_config"]) == started
    claim(run, resume=True, force=True, cfg=started).release()     # nothing changed: no record
    assert len((run / FORCED).read_text().splitlines()) == 1

    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    for old in ("eval/step-0.jsonl", "eval/ood/step-4.jsonl", "reward_errors.rank1.jsonl",
                "wandb/run.log", "plots/reward.png"):
        (run / old).parent.mkdir(parents=True, exist_ok=True)
        (run / old).write_text("old run\n")
    (run / "my_notes.txt").write_text("mine\n")
    claim(run, resume=False, overwrite=True).release()
    assert sorted(p.name for p in run.iterdir()) == [".lock", "my_notes.txt"]


# ---------------------------------------------------------------- prompt lengths at load

def _rows_with(shapes_dir: Path, name: str, changes: dict[int, dict]) -> Path:
    """The first 40 training rows of the shapes set with `changes` made to some of them,
    written beside the set (its images stay inside the data dir)."""
    rows = [json.loads(r) for r in (shapes_dir / "train.jsonl").read_text().splitlines()[:40]]
    for k, change in changes.items():
        rows[k].update(change)
    path = shapes_dir / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_prompt_longer_than_the_context_is_refused_at_load_naming_its_row(
        tmp_path, tiny_vl, shapes_dir):
    """A million-character prompt passed load, and the first rollout tried to allocate 250 GB.
    (`mmrlvr train` prints a DataError as one line and exits 2:
    test_a_bad_image_late_in_the_split_is_found_before_training.)"""
    from mmrlvr.data import DataError

    huge = "How many shapes are there? " * 37_000                    # 999,000 characters
    data = _rows_with(shapes_dir, "huge_prompt.jsonl", {10: {"id": "huge", "prompt": huge}})
    path = config(tmp_path, tiny_vl, shapes_dir, "run", None, data={"train": str(data)})
    with pytest.raises(DataError) as refused:
        train(load_config(path), progress=False)
    assert str(refused.value).startswith(f"{data}, row 11 (id huge): the prompt is at least ")
    assert "over the model's context of 4,096 tokens (max_position_embeddings in " \
        f"{tiny_vl}/config.json)" in str(refused.value) and "on_error=skip" in str(refused.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()          # nothing trained

    # skipped and counted like any bad row; data.max_prompt_tokens bounds it further
    long = "Count the shapes, then count them again. " * 20            # ~200 tokens
    data = _rows_with(shapes_dir, "long_prompts.jsonl", {10: {"id": "huge", "prompt": huge},
                                                           30: {"id": "long", "prompt": long}})
    path = config(tmp_path, tiny_vl, shapes_dir, "skip", None, train={"steps": 1},
                  data={"train": str(data), "on_error": "skip", "max_prompt_tokens": 150})
    with pytest.warns(UserWarning, match="skipped 2 bad row"):
        train(load_config(path), progress=False)
    skipped = [json.loads(ln) for ln in (tmp_path / "skip" / "skipped_rows.jsonl").read_text()
               .splitlines()]
    assert [(s["id"], s["row"]) for s in skipped] == [("huge", 11), ("long", 31)]
    assert all("over data.max_prompt_tokens (150)" in s["reason"] for s in skipped)
    assert read_metrics(tmp_path / "skip" / "metrics.jsonl")[-1]["data/skipped_rows"] == 2


def test_a_prompt_must_leave_the_completion_its_room_in_the_context(tiny_vl, shapes_dir):
    """A prompt that fits the context but leaves fewer than rollout.max_new_tokens tokens for
    the completion is a bad row, and the error says so; a max_new_tokens of the whole context
    is a config error before any row loads."""
    from mmrlvr.config import Config, ConfigError, resolve_model_defaults
    from mmrlvr.data import Example
    from mmrlvr.train.lengths import prompt_budget

    cfg = Config()
    cfg.model.path, cfg.data.train = str(tiny_vl), str(shapes_dir / "train.jsonl")
    cfg = resolve_model_defaults(cfg)
    row = Example(id="long", prompt="How many shapes are there? " * 200, answer="3")
    cfg.rollout.max_new_tokens = 0
    n = prompt_budget(cfg).text_tokens(row)
    assert 1000 < n < 4096 and prompt_budget(cfg).problem(row) is None
    cfg.rollout.max_new_tokens = 4096 - n                      # exactly the room it leaves
    assert prompt_budget(cfg).problem(row) is None
    cfg.rollout.max_new_tokens = 4096 - n + 1
    problem = prompt_budget(cfg).problem(row)
    assert problem is not None and f"{n:,} tokens" in problem
    assert (f"the model's context of 4,096 tokens (max_position_embeddings in {tiny_vl}/"
            f"config.json) less {4096 - n + 1:,} for the completion (rollout.max_new_tokens)"
            in problem)
    cfg.rollout.max_new_tokens = 4096
    with pytest.raises(ConfigError, match=r"rollout.max_new_tokens \(4,096\) leaves no room for "
                                          r"a prompt in the model's context of 4,096 tokens"):
        prompt_budget(cfg)


def test_eval_and_stress_refuse_a_prompt_over_the_context_naming_its_row(tmp_path, tiny_vl,
                                                                         capsys):
    """`mmrlvr eval` and `mmrlvr stress` check prompts against the model's context (less the
    answer's --max-new-tokens) as training does, before the weights load: one line naming the
    file, row and id, exit 2; `mmrlvr eval --on-error skip` drops the row and scores the rest."""
    from mmrlvr.cli import main

    rows = [{"id": f"q{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    rows[1] = {"id": "huge", "prompt": "Count the shapes. " * 60_000, "answer": "3"}
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for command in (["eval", "--model", str(tiny_vl), "--data", str(data), "--modality", "vision",
                     "--max-new-tokens", "4"],
                    ["stress", "--model", str(tiny_vl), "--data", str(data), "--out",
                     str(tmp_path / "report"), "--ops", "template_swap", "--max-new-tokens", "4"]):
        assert main(command) == 2, command[0]
        err = capsys.readouterr().err
        assert f"{data}, row 2 (id huge): the prompt is " in err, (command[0], err)
        assert "over the model's context of 4,096 tokens" in err and "less 4 for the completion" \
            in err, (command[0], err)
    assert not (tmp_path / "report").exists()
    assert main(["eval", "--model", str(tiny_vl), "--data", str(data), "--max-new-tokens", "4",
                 "--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^n\s+2$", out, re.M), out


def test_media_tokens_count_and_a_row_at_the_limit_is_measured_exactly(shapes_dir, tiny_vl,
                                                                       policy):
    """Eight images fit a limit of their exact length, ten do not: the bounds leave both rows
    open, and the rollout's own encoding decides."""
    from mmrlvr.config import Config, resolve_model_defaults
    from mmrlvr.data import DataError, load_split
    from mmrlvr.train.lengths import prompt_budget

    image = json.loads((shapes_dir / "train.jsonl").read_text().splitlines()[0])["images"][0]
    data = _rows_with(shapes_dir, "many_images.jsonl", {
        5: {"id": "eight", "images": [image] * 8, "prompt": "<image>" * 8 + "How many?"},
        6: {"id": "ten", "images": [image] * 10, "prompt": "<image>" * 10 + "How many?"}})
    cfg = Config()
    cfg.model.path, cfg.data.train = str(tiny_vl), str(data)
    cfg = resolve_model_defaults(cfg)
    rows = {ex.id: ex for ex in load_split(cfg.data, "train")}
    eight, ten = (int(policy.adapter.encode([rows[i]], policy.processor)
                      .inputs["attention_mask"].sum()) for i in ("eight", "ten"))
    assert eight < ten
    cfg.data.max_prompt_tokens = eight
    budget = prompt_budget(cfg)
    assert budget.limit == eight and budget.exact_tokens(rows["eight"]) == eight
    for ex in (rows["eight"], rows["ten"]):                         # neither bound decides
        assert budget.text_tokens(ex) <= eight < budget.text_tokens(ex) + budget.media_bound(ex)
    with pytest.raises(DataError, match=rf"row 7 \(id ten\): the prompt is {ten:,} tokens with "
                                        rf"its media, over data.max_prompt_tokens \({eight:,}\)"):
        load_split(cfg.data, "train", budget=budget)
    cfg.data.on_error = "skip"
    with pytest.warns(UserWarning, match="skipped 1 bad row"):
        kept = load_split(cfg.data, "train", budget=budget)
    assert "eight" in {ex.id for ex in kept} and "ten" not in {ex.id for ex in kept}


def test_the_length_check_leaves_a_split_as_it_was_and_a_lazy_split_is_checked_too(
        tmp_path, shapes_dir, tiny_vl):
    """On the default path (no data.max_prompt_tokens, prompts within the context) the split
    loads exactly as without the check, and building the check draws no random numbers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dataclasses

    from mmrlvr.config import Config, ConfigError, resolve_model_defaults, validate
    from mmrlvr.data import DataError, load_dataset, load_split
    from mmrlvr.train.lengths import prompt_budget

    cfg = Config()
    cfg.model.path, cfg.data.train = str(tiny_vl), str(shapes_dir / "train.jsonl")
    cfg.data.format_prompt = "Put the answer in <answer></answer>."
    cfg = resolve_model_defaults(cfg)
    rng = torch.random.get_rng_state()
    budget = prompt_budget(cfg)
    assert torch.equal(rng, torch.random.get_rng_state())
    assert load_split(cfg.data, "train", budget=budget) == load_split(cfg.data, "train")
    assert prompt_budget(cfg).limit == 4096 - cfg.rollout.max_new_tokens   # the tiny model's
    with pytest.raises(ConfigError, match=r"data.max_prompt_tokens.*>= 0.*got -1"):
        validate(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data,
                                                                   max_prompt_tokens=-1)))

    prompts = ["What is 2 + 2?"] * 5 + ["Count to a million. " * 50_000] + ["What is 3 + 3?"] * 5
    table = pa.table({"prompt": prompts, "answer": ["4"] * len(prompts)})
    pq.write_table(table, tmp_path / "text.parquet")
    with pytest.raises(DataError, match=r"row 6 \(id text-6\): the prompt is 600,0\d\d tokens, "
                                        r"over the model's context of 4,096"):
        load_dataset(tmp_path / "text.parquet", lazy=True, budget=budget)
    with pytest.warns(UserWarning, match="skipped 1 bad row"):
        split = load_dataset(tmp_path / "text.parquet", lazy=True, budget=budget, on_error="skip")
    assert len(split) == 10 and all(len(ex.prompt) < 20 for ex in split)
