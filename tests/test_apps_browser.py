"""The demo in a real browser: Playwright drives Debian's Chromium through a vision question.

Needs `apt-get install -y chromium` and `pip install playwright` (no `playwright install`: the
system Chromium is used). Skips, saying which is missing, otherwise. Screenshots go to the test's
tmp dir and, when MMRLVR_ARTIFACTS is set, to that dir too.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.test_apps import free_port, write_run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.filterwarnings("ignore:::gradio.queueing")


def save_artifact(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("MMRLVR_ARTIFACTS"):
        out = Path(os.environ["MMRLVR_ARTIFACTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / name)
    return path


@pytest.fixture()
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="pip package playwright is not installed")
    if not Path(CHROMIUM).is_file():
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


def test_browser_asks_a_vision_question_and_sees_the_answer(browser, policy, tiny_vl, shapes_dir,
                                                             tmp_path):
    from apps.common import DemoContext
    from apps.launcher import build_demo, launch

    run = write_run(tmp_path / "run", partial=False)
    demo = build_demo(DemoContext(policy=policy, model_path=str(tiny_vl), run_dir=str(run)))
    url = launch(demo, port=free_port(), block=False)
    image = min((shapes_dir / "images").glob("*.png"))
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.locator("#vision-files input[type=file]").set_input_files(str(image))
        page.locator("#vision-question textarea").fill("How many shapes are in the image?")
        page.locator("#vision-gold textarea").fill("2")
        page.get_by_label("sample (otherwise greedy)").check()
        page.locator("#vision-submit").click()
        page.locator("#vision-status").get_by_text("done").wait_for(timeout=30_000)
        answer = page.locator("#vision-answer textarea").input_value()
        assert answer                                   # the extracted answer (or its absence)
        assert page.locator("#vision-completion textarea").input_value().strip()
        assert "Gold: 2" in page.locator("#vision-verdict").inner_text()   # the verdict
        save_artifact(page, tmp_path, "demo-vision.png")

        page.get_by_role("tab", name="Training monitor").click()
        page.locator("#monitor-status").get_by_text("step 6 / 12").wait_for(timeout=15_000)
        save_artifact(page, tmp_path, "demo-monitor.png")
    finally:
        demo.close()
