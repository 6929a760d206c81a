"""Run logging: metrics.jsonl always, TensorBoard as before, and the other trackers of
`train.report_to` through accelerate, none of which can stop or stall a run."""
from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from mmrlvr.train import logger as logger_mod
from mmrlvr.train.logger import RunLogger, read_metrics


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: train.report_to")]


def test_a_missing_tracker_package_warns_once_and_the_run_logs_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(logger_mod.TRACKER_PACKAGES, "wandb", "mmrlvr_no_such_tracker_pkg")
    log = RunLogger(tmp_path, report_to=["tensorboard", "wandb"])
    for step in (1, 2, 3):
        log.log(step, {"reward": 0.5 * step, "loss": float("nan"), "note": "x"})
    log.close()
    (warning,) = _warnings(capsys.readouterr().err)
    assert "'mmrlvr_no_such_tracker_pkg'" in warning and "not installed" in warning
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["reward"] == 1.5
    assert rows[0]["loss"] is None                           # non-finite: null, not NaN
    assert list(tmp_path.glob("tb/events.out.tfevents.*"))   # TensorBoard as before


def test_no_trackers_writes_metrics_only(tmp_path, capsys):
    log = RunLogger(tmp_path, report_to=[])
    log.log(1, {"reward": 1.0})
    log.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "reward": 1.0}]
    assert not (tmp_path / "tb").exists() and not _warnings(capsys.readouterr().err)


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path, capsys):
    class Broken:
        name = "broken"

        def log(self, values, step=None):
            raise ConnectionError("server went away")

        def finish(self):
            pass

    log = RunLogger(tmp_path, report_to=[])
    log.trackers.append(Broken())
    log.log(1, {"reward": 1.0})
    log.log(2, {"reward": 0.0})
    (warning,) = _warnings(capsys.readouterr().err)
    assert "broken failed to log step 1 (ConnectionError: server went away)" in warning
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_resume_rewrites_the_steps_after_the_checkpoint(tmp_path):
    log = RunLogger(tmp_path, report_to=[])
    for step in (1, 2, 3):
        log.log(step, {"reward": step})
    log = RunLogger(tmp_path, report_to=[], resume_step=2)
    log.log(3, {"reward": 30})
    assert [r["reward"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 30]


def test_disabled_logger_on_other_ranks_writes_nothing(tmp_path):
    log = RunLogger(tmp_path, enabled=False, report_to=["tensorboard"])
    log.log(1, {"reward": 1.0})
    log.close()
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in `wandb` module that records what the run asked of it."""
    calls: dict = {"logged": []}
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    class Run:
        def log(self, values, step=None):
            calls["logged"].append((step, values))

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        calls["init"] = kwargs
        return Run()

    module.init = init
    module.config = types.SimpleNamespace(update=lambda values, **kw: calls.update(config=values))
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_wandb_logs_offline_without_credentials(tmp_path, capsys, monkeypatch, fake_wandb):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))              # no ~/.netrc login either
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    (tmp_path / "run").mkdir()
    log = RunLogger(tmp_path / "run", report_to=["wandb"],
                    config={"optim": {"lr": 1e-5}, "rewards": [{"name": "accuracy"}]})
    log.log(1, {"reward": 0.25, "note": "text"})
    log.close()
    assert fake_wandb["init"] == {"project": "mmrlvr", "dir": str(tmp_path / "run"),
                                  "name": "run", "mode": "offline"}
    assert fake_wandb["config"] == {"optim.lr": 1e-5, "rewards": "[{'name': 'accuracy'}]"}
    assert fake_wandb["logged"] == [(1, {"reward": 0.25})] and fake_wandb["finished"]
    (warning,) = _warnings(capsys.readouterr().err)
    assert "offline" in warning and "wandb sync" in warning


def test_wandb_mode_from_the_environment_is_respected(tmp_path, monkeypatch, fake_wandb):
    monkeypatch.setenv("WANDB_MODE", "online")
    RunLogger(tmp_path, report_to=["wandb"]).close()
    assert "mode" not in fake_wandb["init"]


def test_a_tracker_that_fails_to_start_is_skipped(tmp_path, capsys, monkeypatch, fake_wandb):
    monkeypatch.setenv("WANDB_MODE", "offline")

    def init(**kwargs):
        raise TimeoutError("no network")

    monkeypatch.setattr(sys.modules["wandb"], "init", init)
    log = RunLogger(tmp_path, report_to=["wandb"])
    log.log(1, {"reward": 1.0})
    (warning,) = _warnings(capsys.readouterr().err)
    assert "wandb failed to start (TimeoutError: no network)" in warning
    assert log.trackers == [] and read_metrics(tmp_path / "metrics.jsonl")
