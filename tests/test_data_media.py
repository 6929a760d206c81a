"""Load-time checks: every image and audio file of a split is opened, decoded and sized when the
split loads, paths stay inside the data dir, gold answers are strings, and skipped rows are saved
with their reasons. Real files throughout: broken PNGs, a 13,000² decompression bomb, bad WAVs."""
from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image, ImageFile

import mmrlvr.data.media as data_mod
from mmrlvr.config import DataConfig
from mmrlvr.data import (DataError, DataWarning, Example, LoadReport, load_dataset,
                         load_jsonl, load_split, write_jsonl)

pytestmark = pytest.mark.filterwarnings("ignore::mmrlvr.data.DataWarning")


# --- files ------------------------------------------------------------------------------------

def _png(path: Path, size=(8, 6)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (200, 30, 30)).save(path)
    return path


def _truncated_png(path: Path) -> Path:
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) * 6 // 10])
    return path


def _chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def _bilevel_png(path: Path, side: int, *, pixels: bool = True) -> Path:
    """A valid side×side 1-bit black PNG written row by row: a few KB on disk for any size,
    never held in memory whole (169 MB once decoded at 13,000²). `pixels=False`: header only."""
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)   # 1 bit, grayscale
    idat = b""
    if pixels:
        row = bytes(1 + (side + 7) // 8)                         # filter byte + packed bits
        comp = zlib.compressobj(9)
        idat = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat)
                     + _chunk(b"IEND", b""))
    return path


def _wav(path: Path, seconds: float = 0.5, rate: int = 8000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate)
    return path


def _jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _row(i: int, image: str | None = None, audio: str | None = None, **extra) -> dict:
    row = {"id": f"q{i}", "prompt": f"question {i}", "answer": str(i % 5)}
    if image:
        row["images"] = [image]
    if audio:
        row["audios"] = [audio]
    return {**row, **extra}


def _single_row_error(path: Path, **options) -> str:
    with pytest.raises(DataError) as err:
        load_jsonl(path, **options)
    return str(err.value)


# --- broken images ----------------------------------------------------------------------------

BROKEN_IMAGES = {
    "empty.png": (lambda p: p.write_bytes(b""), "empty file (0 bytes)"),
    "truncated.png": (_truncated_png, "cannot be decoded"),
    "text.png": (lambda p: p.write_text("this is not an image\n"), "cannot be decoded"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_IMAGES))
def test_broken_image_is_a_bad_row_naming_file_row_id_path_and_reason(tmp_path, name):
    make, reason = BROKEN_IMAGES[name]
    _png(tmp_path / "img" / "ok.png")
    make(tmp_path / "img" / name)
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, "img/ok.png"), _row(2, f"img/{name}"),
                                         _row(3, "img/ok.png")])
    msg = _single_row_error(path)
    assert msg.startswith(f"{path}, row 2 (id q2): image {tmp_path / 'img' / name} ")
    assert reason in msg and "data.on_error=skip" in msg        # what was wrong, and how to skip

    report = LoadReport()
    kept = load_jsonl(path, on_error="skip", report=report)
    assert [ex.id for ex in kept] == ["q1", "q3"] and report.kept == 2
    [skipped] = report.skipped
    assert (skipped.file, skipped.row, skipped.id) == (str(path), 2, "q2")
    assert reason in skipped.reason and name in skipped.reason


def test_missing_image_is_a_bad_row_in_both_modes(tmp_path):
    _png(tmp_path / "ok.png")
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, "ok.png"), _row(2, "gone.png")])
    assert f"row 2 (id q2): image not found: {tmp_path / 'gone.png'}" in _single_row_error(path)
    report = LoadReport()
    assert [ex.id for ex in load_jsonl(path, on_error="skip", report=report)] == ["q1"]
    assert "image not found" in report.skipped[0].reason


def test_decompression_bomb_is_refused_by_its_header_without_decoding(tmp_path, monkeypatch):
    """13,000² 1-bit PNG: ~25 KB on disk, 169 MP. It is refused from the header alone (decoding
    is made to fail loudly) and loads once the limit is raised above its size."""
    bomb = _bilevel_png(tmp_path / "bomb.png", 13_000)
    assert bomb.stat().st_size < 100_000
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, "bomb.png")])

    decodes = []
    real_load = ImageFile.ImageFile.load

    def counting_load(self):
        decodes.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting_load)
    msg = _single_row_error(path)                # default limit: 64 MP
    assert "13000×13000 = 169 MP, over data.max_image_pixels = 64 MP" in msg
    assert "refused before decoding" in msg and decodes == []
    report = LoadReport()
    with pytest.raises(DataError, match="empty"):
        load_dataset(path, on_error="skip", report=report)
    assert "169 MP" in report.skipped[0].reason and decodes == []

    with pytest.warns(Image.DecompressionBombWarning):          # PIL's own warning above 89 MP
        [ex] = load_jsonl(path, max_image_pixels=170_000_000)
    assert decodes == [(13_000, 13_000)] and ex.images == [str(bomb)]


def test_image_over_pils_bomb_limit_is_refused_even_with_a_raised_limit(tmp_path):
    _bilevel_png(tmp_path / "huge.png", 20_000, pixels=False)   # 400 MP: PIL refuses to open it
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, "huge.png")])
    assert "decompression bomb" in _single_row_error(path, max_image_pixels=10**9)


# --- paths ------------------------------------------------------------------------------------

def test_paths_outside_the_data_dir_are_refused_unless_allowed(tmp_path):
    outside = _png(tmp_path / "elsewhere" / "x.png")
    _png(tmp_path / "data" / "img" / "in.png")
    (tmp_path / "data" / "link.png").symlink_to(outside)
    cases = {str(outside): "is absolute",
             "../elsewhere/x.png": "leads outside the data file's dir",
             "link.png": "leads outside the data file's dir"}      # symlinks are resolved
    for image, reason in cases.items():
        path = _jsonl(tmp_path / "data" / "d.jsonl", [_row(1, "img/in.png"), _row(2, image)])
        msg = _single_row_error(path)
        assert f"row 2 (id q2): image path {image!r} {reason}" in msg
        assert "data.allow_outside=true" in msg
        [_, ex] = load_jsonl(path, allow_outside=True)
        assert Path(ex.images[0]).resolve() == outside.resolve()
    # `..` that stays inside the dir is fine
    path = _jsonl(tmp_path / "data" / "d.jsonl", [_row(1, "img/../img/in.png")])
    assert Path(load_jsonl(path)[0].images[0]).resolve() == (tmp_path / "data" / "img" / "in.png")


def test_absolute_system_file_is_never_opened(tmp_path, monkeypatch):
    opened = []
    monkeypatch.setattr(data_mod, "_check_file", lambda *a: opened.append(a))
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, "/etc/passwd"), _row(2, "../../etc/passwd")])
    report = LoadReport()
    with pytest.raises(DataError, match="empty"):
        load_dataset(path, on_error="skip", report=report)
    assert [s.row for s in report.skipped] == [1, 2] and opened == []


def test_steps_layout_refuses_escaping_image_paths(tmp_path):
    _png(tmp_path / "fig.png")
    path = _jsonl(tmp_path / "sub" / "train.jsonl",
                  [{"question": "Find x.", "image": "../fig.png", "answer": "3"}])
    with pytest.raises(DataError, match=r"row 1 \(id train-1\): image path '../fig.png' leads outside"):
        load_dataset(f"steps:{path}")
    assert load_dataset(f"steps:{path}", allow_outside=True)[0].answer == "3"


# --- audio ------------------------------------------------------------------------------------

def _corrupt_wav(path: Path) -> Path:
    path.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + os.urandom(200))
    return path


def _no_frames_wav(path: Path) -> Path:
    sf.write(str(path), np.zeros(0, dtype=np.float32), 8000)
    return path


BROKEN_AUDIO = {
    "empty.wav": (lambda p: p.write_bytes(b""), "empty file (0 bytes)"),
    "corrupt.wav": (_corrupt_wav, "cannot be decoded"),
    "silent.wav": (_no_frames_wav, "holds no samples"),
    "long.wav": (lambda p: _wav(p, seconds=3.0), "lasts 3.0 s, over data.max_audio_seconds = 2 s"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_AUDIO))
def test_broken_or_too_long_audio_is_a_bad_row(tmp_path, name):
    make, reason = BROKEN_AUDIO[name]
    _wav(tmp_path / "a" / "ok.wav")
    make(tmp_path / "a" / name)
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, audio="a/ok.wav"), _row(2, audio=f"a/{name}")])
    msg = _single_row_error(path, max_audio_seconds=2.0)
    assert f"row 2 (id q2): audio {tmp_path / 'a' / name} " in msg and reason in msg
    report = LoadReport()
    kept = load_jsonl(path, on_error="skip", report=report, max_audio_seconds=2.0)
    assert [ex.id for ex in kept] == ["q1"] and reason in report.skipped[0].reason


def test_audio_within_the_default_limit_and_a_missing_clip(tmp_path):
    _wav(tmp_path / "ok.wav", seconds=3.0)
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, audio="ok.wav")])
    assert load_jsonl(path)[0].audios == [str(tmp_path / "ok.wav")]
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, audio="ok.wav"), _row(2, audio="gone.wav")])
    assert "row 2 (id q2): audio not found" in _single_row_error(path)


# --- bad rows late in a long split ------------------------------------------------------------

def _late_split(tmp_path: Path) -> Path:
    """100 rows; row 90 has a truncated image and row 95 is not JSON."""
    _png(tmp_path / "img" / "ok.png")
    _truncated_png(tmp_path / "img" / "late.png")
    rows: list = [_row(i, "img/ok.png") for i in range(1, 101)]
    rows[89] = _row(90, "img/late.png")
    return _jsonl(tmp_path / "train.jsonl", rows)


def test_late_bad_row_stops_a_raise_load_at_row_90(tmp_path):
    path = _late_split(tmp_path)
    msg = _single_row_error(path)
    assert msg.startswith(f"{path}, row 90 (id q90): image {tmp_path / 'img' / 'late.png'} "
                          "cannot be decoded")
    lines = path.read_text().splitlines()
    lines[94] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    assert "row 90 (id q90)" in _single_row_error(path)   # the first bad row, not the JSON one


def test_late_bad_row_is_skipped_and_saved_with_its_reason(tmp_path):
    path = _late_split(tmp_path)
    report = LoadReport()
    with pytest.warns(DataWarning, match=r"skipped 1 bad row\(s\); first: .*row 90 \(id q90\)"):
        kept = load_dataset(path, on_error="skip", report=report)
    assert len(kept) == 99 and "q90" not in {ex.id for ex in kept} and report.kept == 99

    out = report.write(tmp_path / "run")
    assert out == tmp_path / "run" / "skipped_rows.jsonl"
    [saved] = [json.loads(line) for line in out.read_text().splitlines()]
    assert saved["file"] == str(path) and (saved["row"], saved["id"]) == (90, "q90")
    assert saved["reason"].startswith(f"image {tmp_path / 'img' / 'late.png'} cannot be decoded")
    assert LoadReport().write(tmp_path / "run2").read_text() == ""


def test_each_file_is_checked_once_however_many_rows_share_it(tmp_path, monkeypatch):
    checked = []
    real = data_mod._check_file
    monkeypatch.setattr(data_mod, "_check_file", lambda *a: checked.append(a[1]) or real(*a))
    path = _late_split(tmp_path)
    load_jsonl(path, on_error="skip")
    assert sorted(Path(p).name for p in checked) == ["late.png", "ok.png"]


def test_check_media_off_keeps_only_path_and_existence_checks(tmp_path):
    path = _late_split(tmp_path)
    assert len(load_jsonl(path, check_media=False)) == 100
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, "img/ok.png"), _row(2, "../x.png")])
    assert "leads outside" in _single_row_error(path, check_media=False)


# --- answers ----------------------------------------------------------------------------------

def test_numeric_answers_are_converted_and_counted(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [_row(1, answer=3), _row(2), _row(3, answer=2.5),
                                         _row(4, answer="7")])
    report = LoadReport()
    with pytest.warns(DataWarning, match=r"2 gold answer\(s\) were numbers .*\(rows 1, 3\)"):
        kept = load_dataset(path, report=report)
    assert [ex.answer for ex in kept] == ["3", "2", "2.5", "7"]
    assert report.converted_answers == 2 and report.skipped == []


@pytest.mark.parametrize("answer, shown", [
    (["3"], '["3"] (list)'), ({"value": 3}, '{"value": 3} (dict)'), (True, "true (bool)"),
    ("", "null or empty"), ("   ", "null or empty"), (None, "null or empty"),
])
def test_non_string_answers_are_bad_rows_naming_row_and_value(tmp_path, answer, shown):
    path = _jsonl(tmp_path / "d.jsonl", [_row(1), _row(2), _row(3, answer=answer)])
    msg = _single_row_error(path)
    assert msg.startswith(f"{path}, row 3 (id q3): ") and shown in msg and "'answer'" in msg
    report = LoadReport()
    assert len(load_jsonl(path, on_error="skip", report=report)) == 2
    assert report.skipped[0].row == 3 and report.converted_answers == 0


def test_geo3k_rows_with_corrupt_image_bytes_or_list_answers_are_bad_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    good = buf.getvalue()
    table = pa.table({"images": [[{"bytes": good, "path": "a"}], [{"bytes": good[:30], "path": "b"}]],
                      "problem": ["<image>Find x.", "<image>Find y."], "answer": ["1", "2"]})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"row 2 \(id geo3k-2\): image .*cannot be decoded"):
        load_dataset(f"geo3k:{tmp_path / 't.parquet'}")
    report = LoadReport()
    assert [ex.id for ex in load_dataset(f"geo3k:{tmp_path / 't.parquet'}", on_error="skip",
                                         report=report)] == ["geo3k-1"]


# --- load_split, write_jsonl -------------------------------------------------------------------

def test_load_split_applies_every_data_option(tmp_path):
    _png(tmp_path / "elsewhere" / "x.png")
    _png(tmp_path / "d" / "ok.png", size=(40, 40))
    train = _jsonl(tmp_path / "d" / "train.jsonl", [_row(1, "ok.png"), _row(2, "../elsewhere/x.png")])
    evals = _jsonl(tmp_path / "d" / "test.jsonl", [_row(i, "ok.png") for i in range(1, 6)])
    cfg = DataConfig(train=str(train), eval=str(evals), eval_limit=3)
    with pytest.raises(DataError, match="row 2 .*leads outside"):
        load_split(cfg, "train")
    cfg.allow_outside = True
    assert len(load_split(cfg, "train")) == 2
    assert [ex.id for ex in load_split(cfg, "eval")] == ["q1", "q2", "q3"]

    cfg.max_image_pixels, cfg.on_error = 1000, "skip"            # ok.png is 1,600 px
    report = LoadReport()
    assert [ex.id for ex in load_split(cfg, "train", report)] == ["q2"]
    with pytest.raises(DataError, match="empty"):
        load_split(cfg, "eval", report)
    assert [(Path(s.file).name, s.row) for s in report.skipped] == [
        ("train.jsonl", 1)] + [("test.jsonl", i) for i in range(1, 6)]
    assert load_split(DataConfig(train=str(train)), "eval") == []
    with pytest.raises(DataError, match="data.train is empty"):
        load_split(DataConfig(), "train")
    with pytest.raises(ValueError, match="which"):
        load_split(cfg, "test")


def test_write_jsonl_makes_audio_paths_relative_too(tmp_path):
    clip = _wav(tmp_path / "audio" / "a.wav")
    img = _png(tmp_path / "img" / "a.png")
    write_jsonl([Example(id="x", prompt="p", answer="a", images=[str(img)], audios=[str(clip)])],
                tmp_path / "d.jsonl")
    row = json.loads((tmp_path / "d.jsonl").read_text())
    assert (row["images"], row["audios"]) == (["img/a.png"], ["audio/a.wav"])
    assert load_jsonl(tmp_path / "d.jsonl")[0].audios == [str(clip)]


def test_write_jsonl_can_copy_outside_media_in_so_the_dataset_loads_by_default(tmp_path):
    outside = _png(tmp_path / "src" / "scan.png")
    clip = _wav(tmp_path / "src" / "a.wav")
    rows = [Example(id="x", prompt="p", answer="a", images=[str(outside)], audios=[str(clip)]),
            Example(id="y", prompt="p", answer="b", images=[str(outside)])]
    write_jsonl(rows, tmp_path / "plain" / "d.jsonl")
    assert "is absolute" in _single_row_error(tmp_path / "plain" / "d.jsonl")

    write_jsonl(rows, tmp_path / "out" / "d.jsonl", copy_media_to="media")
    raw = [json.loads(line) for line in (tmp_path / "out" / "d.jsonl").read_text().splitlines()]
    assert raw[0]["images"] == raw[1]["images"] and raw[0]["images"][0].startswith("media/")
    assert raw[0]["audios"][0].startswith("media/") and raw[0]["audios"][0].endswith(".wav")
    x, y = load_jsonl(tmp_path / "out" / "d.jsonl")
    assert Path(x.images[0]).read_bytes() == outside.read_bytes()
    assert Path(x.audios[0]).read_bytes() == clip.read_bytes()
