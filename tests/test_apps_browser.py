"""The demo in a real browser, used as a person would: Playwright drives Debian's Chromium at
1280×900 through every tab, and the assertions are about what is on the screen.

Needs `apt-get install -y chromium` and `pip install playwright` (no `playwright install`: the
system Chromium is used). Skips, saying which is missing, otherwise. Screenshots of each tab go to
the test's tmp dir (and to `MMRLVR_ARTIFACTS`, when set); `MMRLVR_SCREENSHOTS=docs/img` also
writes the two that docs/demo.md shows. `MMRLVR_DEMO_RUN=runs/quickstart` drives a real run (its
`final/` model against its starting model) instead of the tiny random ones.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.apps_helpers import free_port, tiny_audio, tones_run, write_model_run  # noqa: F401

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
WIDTH, HEIGHT = 1280, 900
DOCS_SHOTS = ("demo-vision.png", "demo-monitor.png")

pytestmark = pytest.mark.filterwarnings("ignore:::gradio.queueing")


def shoot(page, tmp_path: Path, name: str, full_page: bool = False) -> Path:
    """What the person sees on the first screen (1280×900; with `full_page`, the whole page
    scrolled through), kept as `name`."""
    path = tmp_path / name
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=full_page)
    targets = [os.environ.get("MMRLVR_ARTIFACTS")]
    if name in DOCS_SHOTS:
        targets.append(os.environ.get("MMRLVR_SCREENSHOTS"))
    for target in filter(None, targets):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)
    return path


def in_view(locator, within=None) -> bool:
    """Whether the element lies inside the viewport (and inside `within`'s box, if given)."""
    box = locator.bounding_box()
    outer = within.bounding_box() if within is not None else \
        {"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT}
    return box is not None and box["x"] >= outer["x"] - 1 and box["y"] >= outer["y"] - 1 \
        and box["x"] + box["width"] <= outer["x"] + outer["width"] + 1 \
        and box["y"] + box["height"] <= outer["y"] + outer["height"] + 1


def columns_all_show(page, table_id: str) -> int:
    """Every header cell of a Dataframe lies within the page and within the table's own box (no
    column hidden behind a horizontal scroll); returns the column count."""
    heads = page.locator(f"#{table_id} thead th")
    box = page.locator(f"#{table_id}")
    n = heads.count()
    assert n > 0
    for i in range(n):
        cell = heads.nth(i)
        b, outer = cell.bounding_box(), box.bounding_box()
        assert b["x"] + b["width"] <= min(WIDTH, outer["x"] + outer["width"]) + 1, \
            f"column {cell.inner_text()!r} of #{table_id} is cut off"
    return n


def rows_shown(page, table_id: str) -> int:
    """Body rows a Dataframe has drawn (Gradio draws them as `[aria-rowindex]` cells)."""
    return page.locator(f"#{table_id}").evaluate(
        "e => new Set([...e.querySelectorAll('[aria-rowindex]')]"
        ".map(x => x.getAttribute('aria-rowindex'))).size - 1")


WATCH = """sel => { window.seenLengths = [];
  const tick = () => { const e = document.querySelector(sel);
    const n = e ? e.value.length : -1;
    if (!window.seenLengths.includes(n)) window.seenLengths.push(n);
    requestAnimationFrame(tick); };
  tick(); }"""
"""Records, frame by frame, each distinct length of a text box's value."""


def generating() -> bool:
    return any(t.name == "demo-generate" for t in threading.enumerate())


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="pip package playwright is not installed")
    if not Path(CHROMIUM).is_file():
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


def serve(run: Path, model: Path):
    from apps.launcher import build_demo, launch, load_context, media_files

    ctx = load_context(str(model), str(run), device="cpu")
    demo = build_demo(ctx)
    return ctx, demo, launch(demo, port=free_port(), block=False, allowed=media_files(ctx))


@pytest.fixture(scope="module")
def vision_run(tmp_path_factory, tiny_vl, tiny_qwen2vl, shapes_dir) -> Path:
    if os.environ.get("MMRLVR_DEMO_RUN"):
        return Path(os.environ["MMRLVR_DEMO_RUN"])
    return write_model_run(tmp_path_factory.mktemp("browser") / "run", tiny_vl, tiny_qwen2vl,
                           shapes_dir / "test.jsonl")


def test_vision_robustness_and_monitor_as_a_person_uses_them(browser, vision_run, tmp_path,
                                                             monkeypatch):
    from apps import generate

    stopped = []                      # each time the stop criterion ended a generate early
    slow = []                         # set: each token waits 50 ms (the reload's answer is long)
    criterion = generate._Stop.__call__

    def spy(self, *args, **kw):
        if slow:
            time.sleep(0.05)
        out = criterion(self, *args, **kw)
        if bool(out.all()):
            stopped.append(time.monotonic())
        return out

    monkeypatch.setattr(generate._Stop, "__call__", spy)
    ctx, demo, url = serve(vision_run, vision_run / "final")
    example = ctx.info.examples[0]
    try:
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        page.goto(url)
        # the page opens on the tab the model serves, says what it is, asks within the first screen
        assert page.get_by_role("tab", name="Vision QA").get_attribute("aria-selected") == "true"
        assert "Task:" in page.locator("#demo-header").inner_text()
        assert in_view(page.locator("#vision-submit")) and in_view(page.locator("#vision-status"))
        # click an example, ask with Enter, read both verdicts
        page.locator("#vision-examples tbody tr").first.click()
        question = page.locator("#vision-question textarea")
        page.wait_for_function("q => document.querySelector('#vision-question textarea')"
                               ".value === q", arg=example.prompt)
        assert page.locator("#vision-gold textarea").input_value() == example.answer
        question.press("End")
        question.press("Enter")
        page.locator("#vision-status").get_by_text("done").wait_for(timeout=60_000)
        assert "\n" not in question.input_value()                 # Enter asked, added no line
        for verdict in ("#vision-verdict", "#vision-base-verdict"):
            text = page.locator(verdict).inner_text()
            assert f"{example.answer}" in text and ("Correct" in text or "Wrong" in text
                                                    or "No answer found" in text)
        assert page.locator("#vision-answer").inner_text().strip()
        assert in_view(page.locator("#vision-status"))
        assert columns_all_show(page, "vision-rewards") == 5
        assert "what GRPO maximised" in page.locator("#vision-rewards").inner_text()
        page.get_by_text("raw completion").first.click()           # raw text, one click away
        assert page.locator("#vision-raw textarea").input_value()
        shoot(page, tmp_path, "demo-vision.png")

        # reload while the answer streams: generation stops, the model is free again
        page.get_by_text("generation settings").first.click()
        page.locator("#vision-max-new input[type=number]").fill("2048")
        page.locator("#vision-max-new input[type=number]").press("Tab")
        # 2,048 tokens at 50 ms each outlast the reload by far: on an idle machine the tiny model
        # wrote them all before the server saw the client leave (CI, stop 41). Its end-of-text
        # tokens are suppressed here, so that only the stop criterion can end it early
        for policy in {id(p): p for p in (ctx.policy, ctx.base) if p is not None}.values():
            monkeypatch.setattr(policy, "placeholder_ids",
                                list(policy.placeholder_ids) + list(policy.eos_ids))
        slow.append(True)
        page.locator("#vision-submit").click()
        # "Generating with": the last answer's status ("✓ done: trained 12 tokens, …") also says
        # tokens, and waiting on that word once reloaded before this ask reached the server
        page.locator("#vision-status").get_by_text("Generating with").wait_for(timeout=30_000)
        stopped.clear()
        page.reload()
        # stopped by the client leaving, not by reaching its end: the stop criterion fired. The
        # deadline is wide (a token took seconds on a machine at load 12); what is pinned is the
        # cause, not the time
        deadline = time.monotonic() + 120
        # and the lock: it is freed just after the generate thread ends (the stream's close)
        while (generating() or ctx.lock.locked()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not generating() and not ctx.lock.locked() and stopped
        slow.clear()
        monkeypatch.undo()         # the EOS suppression (and the spy) end here
        monkeypatch.setattr(generate._Stop, "__call__", spy)

        # robustness: an example through the operators; the whole table in view, columns shown
        page.get_by_role("tab", name="Robustness").click()
        page.locator("#robust-examples tbody tr").first.click()
        page.wait_for_function("() => document.querySelector('#robust-question textarea')"
                               ".value.length > 0")
        page.locator("#robust-submit").click()
        page.locator("#robust-status").get_by_text("operators ran").wait_for(timeout=60_000)
        status = page.locator("#robust-status").inner_text()
        assert "Did not apply to this sample:" in status and "noise_snr" not in status
        ran = int(status.split("✓ ")[1].split()[0])
        assert rows_shown(page, "robust-table") == ran + 1
        assert columns_all_show(page, "robust-table") == 7
        scroll = page.locator("#robust-table .virtual-table-viewport")
        assert scroll.evaluate("e => e.scrollHeight <= e.clientHeight + 2")   # no inner scroll
        shoot(page, tmp_path, "demo-robustness.png", full_page=True)

        # the monitor: the run's start → end figures and its curves
        page.get_by_role("tab", name="Training monitor").click()
        page.locator("#monitor-status").get_by_text("GRPO run").wait_for(timeout=15_000)
        figures = page.locator("#monitor-start-end").inner_text()
        summary = ctx.info.summary
        assert f"{summary['accuracy_start']:.3f} → {summary['accuracy_end']:.3f}" in figures
        page.locator("#monitor-plot img").wait_for(timeout=15_000)
        shoot(page, tmp_path, "demo-monitor.png")

        # a tab this model cannot serve says how to load one, and takes no input
        page.get_by_role("tab", name="Audio QA").click()
        note = page.locator("#audio-unavailable").inner_text()
        assert "mmrlvr demo --model runs/tones_grpo/final --run runs/tones_grpo" in note
        assert page.locator("#audio-submit").is_disabled()
        shoot(page, tmp_path, "demo-audio-unavailable.png")
    finally:
        demo.close()


def test_audio_tab_streams_gives_a_verdict_and_clears(browser, tones_run, tmp_path):
    ctx, demo, url = serve(tones_run, tones_run / "final")
    example = ctx.info.examples[0]
    try:
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        page.goto(url)
        assert page.get_by_role("tab", name="Audio QA").get_attribute("aria-selected") == "true"
        assert in_view(page.locator("#audio-submit"))
        page.locator("#audio-examples tbody tr").first.click()
        page.wait_for_function("() => document.querySelector('#audio-gold textarea')"
                               ".value.length > 0")
        assert page.locator("#audio-gold textarea").input_value() == example.answer
        page.get_by_text("generation settings").first.click()
        page.locator("#audio-sample input").check()
        page.locator("#audio-max-new input[type=number]").fill("160")
        page.locator("#audio-max-new input[type=number]").press("Tab")
        page.evaluate(WATCH, "#audio-reasoning textarea")     # every length the page shows
        page.locator("#audio-submit").click()
        page.locator("#audio-status").get_by_text("done").wait_for(timeout=60_000)
        seen = page.evaluate("() => window.seenLengths")
        assert len(seen) >= 3, f"the answer arrived at once (lengths seen: {sorted(seen)})"
        for verdict in ("#audio-verdict", "#audio-base-verdict"):
            assert f"`{example.answer}`" not in page.locator(verdict).inner_text()  # rendered
            assert example.answer in page.locator(verdict).inner_text()
        assert columns_all_show(page, "audio-rubrics") == 5
        page.get_by_text("generation settings").first.click()
        shoot(page, tmp_path, "demo-audio.png")
        page.locator("#audio-input button[aria-label='Clear']").first.click()
        page.locator("#audio-status").get_by_text("Clip cleared").wait_for(timeout=10_000)
        assert page.locator("#audio-verdict").inner_text().strip() == ""
        assert page.locator("#audio-reasoning textarea").input_value() == ""
    finally:
        demo.close()
