"""The demo's Tool use tab (apps/tools_tab.py): one multi-turn trajectory shown turn by turn.

A tiny Qwen2-Audio warm-started for 60 SFT steps on two rows of the clip task's gold
trajectories (as `mmrlvr sft` with `rollout.tools` does it) writes its own `clip` call; the tab
runs it with the run's tools through a real Gradio server, called with gradio_client: the
prompt, the policy's call, the clip the tool cut (the file the page plays holds exactly the
samples `clip` returns for that call), the final answer and its verdict. A tool that raises is
shown as the error the policy read, and the trajectory goes on."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import yaml

from apps import tools_tab
from mmrlvr.tasks.clip import make_clip
from tests.apps_helpers import free_port, write_model_run

pytestmark = [pytest.mark.filterwarnings("ignore:::gradio.queueing"),
              pytest.mark.filterwarnings("ignore::mmrlvr.data.AudioWarning")]


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory):
    """A run dir whose `final` model calls clip: SFT on two clip rows' gold trajectories."""
    from mmrlvr.config import load_config
    from mmrlvr.data.loading import load_jsonl
    from mmrlvr.tiny import build_tiny
    from mmrlvr.train.sft import sft

    root = tmp_path_factory.mktemp("clip-run")
    make_clip(root / "clip", n_train=2, n_test=0, seed=0, families=["pitch"])
    data = root / "clip" / "train.jsonl"
    corpus = [t["text"] for ex in load_jsonl(data) for t in ex.meta["trajectory"]] * 20
    tiny = build_tiny("qwen2-audio", root / "tiny", extra_corpus=corpus)
    tools = ["rollout.tools=[{name: clip}]", "rollout.max_turns=2", "model.modality=audio",
             "model.freeze_audio=true", f"data.train={data}", "train.threads=1", "train.seed=0"]
    sft(load_config(None, tools + [f"model.path={tiny}", "sft.steps=60", "sft.batch_size=2",
                                   "sft.lr=5e-3", "sft.warmup_steps=2",
                                   f"sft.out_dir={root / 'sft'}"]), progress=False)
    run = write_model_run(root / "run", root / "sft" / "final", tiny, data, modality="audio")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["format_prompt"] = ""                     # as the warm start was asked
    cfg["rollout"] = {"tools": [{"name": "clip"}], "max_turns": 2, "max_trajectory_tokens": 200}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return run


@pytest.fixture(scope="module")
def cctx(clip_run):
    from apps.launcher import load_context

    return load_context(str(clip_run / "final"), str(clip_run), device="cpu", compare="none")


def texts(chat: list[dict]) -> list[str]:
    """Each message's text ("" for a component) as the client gets it."""
    out = []
    for m in chat:
        parts = m["content"] if isinstance(m["content"], list) else [m["content"]]
        out.append(" ".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in parts))
    return out


def components(chat: list[dict], kind: str) -> list[str]:
    """The files of the `kind` components (image, audio) in the chat, in order."""
    return [p["value"] if isinstance(p["value"], str) else p["value"]["path"]
            for m in chat for p in (m["content"] if isinstance(m["content"], list) else [])
            if isinstance(p, dict) and p.get("component") == kind]


def test_client_runs_a_trajectory_and_sees_each_turn_and_the_clip(cctx):
    import soundfile as sf
    from gradio_client import Client, handle_file

    from apps.launcher import build_demo, launch, media_files
    from mmrlvr.tools.builtin import clip

    demo = build_demo(cctx)
    url = launch(demo, port=free_port(), block=False, allowed=media_files(cctx))
    try:
        client = Client(url, verbose=False)
        media, question, gold = client.predict(0, api_name="/tools_example")
        example = cctx.info.examples[0]
        assert question == example.prompt and gold == example.answer
        chat, traj, status = client.predict(handle_file(media), question, gold, False, 1.0, 48, 2,
                                            api_name="/tools_run")
    finally:
        demo.close()
    assert status.startswith("✓ done: 2 turns, 1 tool call, ended: answer"), status
    call = traj["turns"][0]["call"]
    assert call["name"] == "clip" and traj["turns"][0]["result_kind"] == "audio"
    assert traj["turns"][1]["call"] is None and traj["ended"] == "answer"
    titles = [(m.get("metadata") or {}).get("title") or "" for m in chat]
    said = texts(chat)
    assert said[0] == question                                          # the prompt
    assert any(t.startswith("turn 1: the policy") for t in titles)
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call["arguments"].items())
    assert f"🛠 turn 1: clip({args}) → audio" in titles
    assert any(t.startswith("final answer") for t in titles)
    final = traj["turns"][1]["text"]
    assert any(final in s for s in said)                                # as the policy wrote it
    assert any(s.startswith(("✓ **Correct**", "✗ **Wrong**", "**No answer")) for s in said)
    prompt_audio, tool_audio = components(chat, "audio")                # the prompt's, the tool's
    heard, rate = sf.read(tool_audio, dtype="float32")
    wave, sr = clip(example, **call["arguments"])
    assert rate == sr and heard.shape == wave.shape == (3 * sr,)       # the 3 s segment
    assert np.abs(heard - wave).max() < 1e-3                            # ... the samples cut
    assert sf.info(prompt_audio).duration == pytest.approx(12.0)        # the whole recording


def test_each_tool_result_shows_as_it_comes_back_and_a_raising_tool_is_the_error_read(
        cctx, tmp_path):
    updates = list(tools_tab.run(cctx, cctx.info.examples[0].audios[0],
                                 cctx.info.examples[0].prompt, max_new_tokens=48))
    lines = [u[2].split("…")[0] for u in updates[:-1]]
    assert list(dict.fromkeys(lines)) == ["Turn 1 of at most 2", "Turn 2 of at most 2"]
    live = updates[lines.index("Turn 2 of at most 2")][0]     # before the answer: the clip
    assert "→ audio" in live[-2]["metadata"]["title"] and live[-1]["role"] == "assistant"
    assert updates[-1][2].startswith("✓ done")
    tool = tmp_path / "broken.py"
    tool.write_text("def clip(example, t0, t1):\n    raise RuntimeError('no audio here')\n")
    config = {**cctx.info.config, "rollout": {"tools": [{"name": f"{tool}:clip"}],
                                              "max_turns": 2}}
    broken = dataclasses.replace(cctx, info=dataclasses.replace(cctx.info, config=config))
    chat, traj, status = list(tools_tab.run(broken, cctx.info.examples[0].audios[0],
                                            cctx.info.examples[0].prompt, max_new_tokens=48))[-1]
    error = traj["turns"][0]["tool_error"]
    assert error == "raised: clip raised RuntimeError: no audio here"
    assert len(traj["turns"]) == 2 and status.startswith("✓ done: 2 turns, 1 tool call")
    shown = [m for m in chat if "→ error" in ((m.get("metadata") or {}).get("title") or "")]
    assert len(shown) == 1 and f"error: {error}" in shown[0]["content"]
    fake = tmp_path / "fake.wav"
    fake.write_text("hello")
    status = list(tools_tab.run(cctx, str(fake), "What?"))[-1][2]
    assert status.startswith("⚠ fake.wav cannot be used as audio"), status


def test_a_model_without_a_call_and_bad_input_are_said(policy, shapes_dir):
    from apps.common import DemoContext

    ctx = DemoContext(policy=policy, model_path="tiny")         # no run: the built-in zoom
    assert tools_tab.tool_specs(ctx) == ([{"name": "zoom"}], 3, 0)
    image = str(min((shapes_dir / "images").glob("*.png")))
    # 8 tokens hold no whole call (the shortest is over 20): one turn, no tool run
    chat, traj, status = list(tools_tab.run(ctx, image, "How many shapes?", max_new_tokens=8))[-1]
    assert status.startswith("✓ done: 1 turn, 0 tool calls") and len(traj["turns"]) == 1
    assert status.endswith("the model answered without calling a tool")
    assert chat[0]["content"] == "How many shapes?"
    assert [(m.get("metadata") or {}).get("title", "")[:12] for m in chat][-1] == "final answer"
    assert "Upload an image" in list(tools_tab.run(ctx, None, "How many?"))[-1][2]
    assert "Type a question" in list(tools_tab.run(ctx, image, " "))[-1][2]
    none = DemoContext()
    assert "No model is loaded" in list(tools_tab.run(none, image, "How many?"))[-1][2]


def test_a_client_that_leaves_runs_no_tool_after_it(cctx, tmp_path):
    """Closing the handler (what Gradio does when the page goes) before the first turn ends:
    that turn is the last, its call is never run, and the model is free for the next ask."""
    tool = tmp_path / "counted.py"
    calls = tmp_path / "calls.txt"
    tool.write_text(f"def clip(example, t0, t1):\n    open({str(calls)!r}, 'a').write('x')\n"
                    "    return 'nothing'\n")
    config = {**cctx.info.config, "rollout": {"tools": [{"name": f"{tool}:clip"}],
                                              "max_turns": 2}}
    counted = dataclasses.replace(cctx, info=dataclasses.replace(cctx.info, config=config))
    ex = cctx.info.examples[0]
    handler = tools_tab.run(counted, ex.audios[0], ex.prompt, max_new_tokens=48)
    assert next(handler)[2].startswith("Turn 1 of at most 2")
    handler.close()
    assert not calls.exists() and not cctx.lock.locked()
    *_, status = list(tools_tab.run(counted, ex.audios[0], ex.prompt, max_new_tokens=48))[-1]
    assert status.startswith("✓ done: 2 turns, 1 tool call") and calls.read_text() == "x"
