"""Video as a dataset input: clips read and sampled as qwen-vl-utils samples them (real PyAV
encode and decode), `videos` columns in every layout, and bad videos named at load."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrlvr.data import (DataError, LoadReport, load_dataset, load_jsonl, read_video,
                         video_problem, write_jsonl, write_video)
from mmrlvr.data.video import encoder_for, sample_indices

N, SIDE = 8, 56


def _frame(k: int) -> np.ndarray:
    """Frame k: a white square whose left edge stands at 4 + 5k px, on black."""
    a = np.zeros((SIDE, SIDE, 3), np.uint8)
    a[20:36, 4 + 5 * k:20 + 5 * k] = 255
    return a


def _left_edge(im: Image.Image) -> int:
    cols = np.flatnonzero(np.asarray(im.convert("L"))[28] > 128)
    return int(cols[0])


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("video-data")
    frames = [_frame(k) for k in range(N)]
    write_video(root / "clips" / "a.mp4", frames, 4)
    write_video(root / "clips" / "long.mp4", frames, 1)             # 8 s
    (root / "clips" / "bad.mp4").write_bytes(os.urandom(1500))
    (root / "frames").mkdir()
    for k in range(12):                                             # natural order: 9 < 10
        Image.fromarray(frames[k % N]).save(root / "frames" / f"{k}.png")
    return root


def test_an_mp4_is_sampled_at_fps_with_its_frames_in_order(media):
    clip = read_video(media / "clips" / "a.mp4", fps=2.0, max_frames=16)
    assert (clip.total_frames, clip.native_fps, clip.duration) == (8, 4.0, 2.0)
    assert clip.indices == [0, 2, 5, 7] and clip.sample_fps == 2.0    # 2 s × 2 fps
    assert all(im.mode == "RGB" and im.size == (SIDE, SIDE) for im in clip.frames)
    assert [_left_edge(im) for im in clip.frames] == [4 + 5 * k for k in clip.indices]
    every = read_video(str(media / "clips" / "a.mp4"), fps=100.0, max_frames=6)
    assert every.indices == [0, 1, 3, 4, 6, 7]                        # max_frames caps, spread


@pytest.mark.skipif(encoder_for(".webm") is None, reason="no VP8/VP9 encoder in this PyAV")
def test_a_webm_reads_like_the_mp4(media, tmp_path):
    write_video(tmp_path / "a.webm", [_frame(k) for k in range(N)], 4)
    clip = read_video(tmp_path / "a.webm", fps=4.0)
    assert clip.total_frames == 8 and clip.indices == list(range(8))
    assert [_left_edge(im) for im in clip.frames] == [4 + 5 * k for k in range(8)]


def test_frame_folders_lists_bytes_and_dicts(media):
    folder = read_video(media / "frames", fps=2.0, max_frames=16)
    assert folder.total_frames == 12 and folder.indices == list(range(12))
    assert folder.native_fps == 2.0 and folder.duration == 6.0        # the fps given is theirs
    assert [_left_edge(im) for im in folder.frames] == [4 + 5 * (k % N) for k in range(12)]
    paths = [str(media / "frames" / f"{k}.png") for k in range(5)]
    assert read_video(paths, max_frames=4).indices == [0, 1, 3, 4]    # 5 frames, capped at 4
    mixed = [Image.fromarray(_frame(0)), _frame(1), paths[2]]
    assert [_left_edge(im) for im in read_video(mixed).frames] == [4, 14]   # 3 -> 2 (even)
    one = read_video([_frame(3)])
    assert one.indices == [0, 0] and len(one.frames) == 2            # padded by repeating
    data = (media / "clips" / "a.mp4").read_bytes()
    assert read_video(data, fps=4.0).indices == list(range(8))
    assert read_video({"bytes": data, "path": "x.mp4"}, fps=4.0).total_frames == 8


def test_frame_counts_are_even_capped_and_spread():
    for total, native, fps, cap in [(8, 4, 2, 16), (300, 30, 2, 16), (7, 2, 2, 16), (3, 1, 2, 16),
                                    (1000, 25, 2, 15), (2, 30, 0.1, 16), (9, 9, 9, 4)]:
        idx = sample_indices(total, native, fps, cap)
        assert len(idx) % 2 == 0 and 2 <= len(idx) <= min(cap, max(total, 2)), (total, idx)
        assert idx[0] == 0 and idx[-1] == total - 1 and idx == sorted(set(idx)), idx
    assert len(sample_indices(300, 30, 2, 16)) == 16 and len(sample_indices(40, 10, 2, 16)) == 8
    assert sample_indices(1, 30, 2, 16) == [0, 0]


def test_unreadable_videos_are_value_errors_that_say_what(media):
    with pytest.raises(ValueError, match=r"^sample q1: .*bad\.mp4 cannot be opened as a video"):
        read_video(media / "clips" / "bad.mp4", what="sample q1")
    with pytest.raises(ValueError, match=r"^video: .*nope\.mp4 not found"):
        read_video(media / "nope.mp4")
    with pytest.raises(ValueError, match="frames of different sizes"):
        read_video([_frame(0), np.zeros((28, 28, 3), np.uint8)])
    assert "in-memory video (7 bytes) cannot be opened" in video_problem(b"garbage",
                                                                          max_seconds=60)
    assert video_problem(media / "frames", max_seconds=1, max_frames_source=10) \
        .endswith("holds 12 frames, over the limit of 10")
    assert video_problem(media / "clips" / "long.mp4", max_seconds=5) == (
        f"video {media / 'clips' / 'long.mp4'} lasts 8.0 s, over data.max_video_seconds = 5 s "
        "(cut it or raise the limit)")
    assert video_problem(media / "clips" / "a.mp4", max_seconds=5) is None


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_jsonl_row_with_videos_loads_with_absolute_paths(media, tmp_path):
    path = _jsonl(media / "ok.jsonl", [
        {"id": "a", "prompt": "<video>Which way?", "answer": "right", "videos": ["clips/a.mp4"]},
        {"id": "b", "prompt": "Which way?", "answer": "right", "videos": ["frames"]},
        {"id": "c", "prompt": "Compare <video> with <video>.", "answer": "same",
         "videos": [["frames/0.png", "frames/1.png"], "clips/a.mp4"]}])
    a, b, c = load_jsonl(path)
    assert a.videos == [str(media / "clips" / "a.mp4")] and a.prompt == "Which way?"
    assert Path(b.videos[0]).is_dir() and Path(b.videos[0]).is_absolute()
    assert c.videos[0] == [str(media / "frames" / "0.png"), str(media / "frames" / "1.png")]
    assert c.prompt == "Compare <video> with <video>."                # markers keep their places
    write_jsonl([a, b, c], media / "again.jsonl")
    assert [e.videos for e in load_jsonl(media / "again.jsonl")] == [a.videos, b.videos, c.videos]
    assert json.loads((media / "again.jsonl").read_text().splitlines()[2])["videos"] == \
        [["frames/0.png", "frames/1.png"], "clips/a.mp4"]


def test_chat_prompts_carry_video_parts(media):
    path = _jsonl(media / "chat.jsonl", [
        {"prompt": [{"role": "user", "content": [{"type": "video", "video": "clips/a.mp4"},
                                                 {"type": "text", "text": "Which way?"}]}],
         "solution": "right"},
        {"prompt": [{"role": "user", "content": [{"type": "video"}, {"type": "text",
                                                                     "text": "Which way?"}]}],
         "solution": "right", "video": "frames"}])
    inline, column = load_dataset(path)
    assert inline.videos == [str(media / "clips" / "a.mp4")] and inline.chat
    assert column.videos == [str(media / "frames")] and column.prompt == "Which way?"


def test_a_trl_parquet_with_video_bytes_loads(media):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = (media / "clips" / "a.mp4").read_bytes()
    pq.write_table(pa.table({"prompt": ["<video>Which way?", "Where does it go?"],
                             "solution": ["right", "right"],
                             "videos": [[{"bytes": data, "path": None}],
                                        [{"bytes": data, "path": "a.mp4"}]]}),
                   media / "trl.parquet")
    for lazy in (False, True):
        rows = load_dataset(media / "trl.parquet", lazy=lazy)
        ex = rows[1]
        assert ex.videos == [data] and ex.answer == "right" and ex.meta["solution"] == "right"
        assert read_video(ex.videos[0], fps=4.0).total_frames == 8


def test_bad_videos_are_named_at_load_and_skipped(media):
    path = _jsonl(media / "bad.jsonl", [
        {"id": "ok", "prompt": "Which way?", "answer": "right", "videos": ["clips/a.mp4"]},
        {"id": "junk", "prompt": "Which way?", "answer": "right", "videos": ["clips/bad.mp4"]},
        {"id": "long", "prompt": "Which way?", "answer": "right", "videos": ["clips/long.mp4"]},
        {"id": "two", "prompt": "<video><video> Same?", "answer": "yes", "videos": ["clips/a.mp4"]},
        {"id": "out", "prompt": "Which way?", "answer": "right", "videos": ["../a.mp4"]},
        {"id": "gone", "prompt": "Which way?", "answer": "right", "videos": ["frames/none"]}])
    with pytest.raises(DataError) as err:
        load_jsonl(path, max_video_seconds=5)
    assert str(err.value).startswith(f"{path}, row 2 (id junk): video ")
    assert "bad.mp4 cannot be opened as a video" in str(err.value)
    assert "data.on_error=skip" in str(err.value)
    report = LoadReport()
    with warnings.catch_warnings(record=True):
        kept = load_jsonl(path, on_error="skip", report=report, max_video_seconds=5)
    assert [e.id for e in kept] == ["ok"] and report.kept == 1
    reasons = {s.id: (s.file, s.row, s.reason) for s in report.skipped}
    assert {k: v[1] for k, v in reasons.items()} == {"junk": 2, "long": 3, "two": 4, "out": 5,
                                                     "gone": 6}
    assert all(file == str(path) for file, _, _ in reasons.values())
    assert "lasts 8.0 s, over data.max_video_seconds = 5 s" in reasons["long"][2]
    assert reasons["two"][2].startswith("the prompt holds 2 video placeholder(s)")
    assert "leads outside the data file's dir" in reasons["out"][2]
    assert reasons["gone"][2].startswith("video not found")


def test_config_keys_for_video():
    from mmrlvr.config import load_config

    cfg = load_config(None, [])
    assert (cfg.data.video_fps, cfg.data.max_frames, cfg.data.max_video_pixels,
            cfg.data.max_video_seconds) == (2.0, 16, 0, 600.0)
