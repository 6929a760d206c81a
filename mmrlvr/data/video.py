"""Video: reading a clip as the frames a model sees, the load-time check of a video, and writing
one (the motion task and tests make their clips with it).

A video is a file PyAV opens (mp4, webm, mkv, avi, mov, gif, ...), a folder of frame images
(sorted by name in natural order: `9.png` before `10.png`), a list of frames (paths, PIL images
or HxWxC uint8 arrays), the encoded bytes of a file (a parquet/arrow column), or a datasets-style
`{"bytes": ..., "path": ...}` dict.

Frames are sampled as qwen-vl-utils' `fetch_video` samples them (`smart_nframes`): `n = duration
× fps`, clamped to [2, max_frames] and to the source's frame count, rounded down to an even
number (Qwen-VL merges frames in pairs); the indices are spread evenly over the source
(`linspace(0, total - 1, n)`, rounded). A source of one frame gives that frame twice. Frame
folders and lists have no frame rate of their own: `fps` is taken as theirs, as qwen-vl-utils
assumes, so all their frames are used up to `max_frames`. Decoding is PyAV's (torchvision 0.29
has no video reader to rely on); every failure is a `ValueError` saying what and why, never a
raw PyAV traceback.
"""
from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

FRAME_FACTOR = 2
"""Sampled frame counts are multiples of this (qwen-vl-utils' FRAME_FACTOR)."""
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
"""The files of a frame folder that are its frames."""
FULL_DECODE_FRAMES = 300
"""`video_problem` decodes a clip of at most this many frames whole; a longer one only at its
first frame and from the last keyframe to its end."""


@dataclass
class Clip:
    """The frames sampled from one video, and where they came from."""

    frames: list[Image.Image]
    """RGB frames, an even count >= 2 (one source frame is repeated)."""
    indices: list[int]
    """The sampled frames' indices in the source."""
    native_fps: float
    """The source's frame rate (frame folders and lists: the `fps` asked for)."""
    total_frames: int
    """Frames in the source."""

    @property
    def duration(self) -> float:
        """Seconds the source lasts: total_frames / native_fps."""
        return self.total_frames / self.native_fps

    @property
    def sample_fps(self) -> float:
        """Frames per second of the sampled frames (what Qwen-VL's temporal positions need)."""
        return len(self.frames) / self.duration


def sample_indices(total: int, native_fps: float, fps: float, max_frames: int) -> list[int]:
    """Which of `total` source frames to keep (qwen-vl-utils' `smart_nframes` + linspace)."""
    if total < 1:
        raise ValueError("holds no frames")
    cap = max(FRAME_FACTOR, max_frames // FRAME_FACTOR * FRAME_FACTOR)
    wanted = total / native_fps * fps
    n = min(max(wanted, FRAME_FACTOR), cap, total)
    n = int(n // FRAME_FACTOR * FRAME_FACTOR)
    if n < FRAME_FACTOR:                       # a one-frame source: its frame, repeated
        return [0] * FRAME_FACTOR
    return [int(i) for i in np.linspace(0, total - 1, n).round().astype(np.int64)]


def read_video(source: Any, *, fps: float = 2.0, max_frames: int = 16,
               what: str = "video") -> Clip:
    """The frames of `source` a model sees at `fps` frames per second, at most `max_frames`.

    `what` begins every error message (e.g. "sample q1: video 0"). Raises ValueError for a
    missing, unreadable, empty or undecodable source."""
    if not (fps > 0 and math.isfinite(fps)):
        raise ValueError(f"{what}: fps must be a positive number, got {fps!r}")
    if max_frames < FRAME_FACTOR:
        raise ValueError(f"{what}: max_frames must be >= {FRAME_FACTOR}, got {max_frames}")
    try:
        kind, value = _resolve(source)
        if kind == "frames":
            return _clip_of_frames(value, fps, max_frames)
        return _clip_of_file(value, fps, max_frames)
    except (ValueError, OSError) as err:       # a predicate: "cannot be decoded (...)"
        raise ValueError(f"{what}: {_subject(source)} {_predicate(err)}") from None


def _predicate(err: Exception) -> str:
    """What went wrong, said of the video: a ValueError's own text, an OSError's reason."""
    if isinstance(err, OSError):
        return f"cannot be read ({err.strerror or err})"
    return str(err)


def _resolve(source: Any) -> tuple[str, Any]:
    """("file", path or bytes) or ("frames", list of frames) for any accepted source."""
    if isinstance(source, dict):
        data, path = source.get("bytes"), source.get("path")
        if data is None and path is None:
            raise ValueError("has neither 'bytes' nor 'path'")
        source = data if data is not None else path
    if isinstance(source, (bytes, bytearray, memoryview)):
        if not len(source):
            raise ValueError("is empty (0 bytes)")
        return "file", bytes(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return "frames", folder_frames(path)
        if not path.is_file():
            raise ValueError("not found")
        if path.stat().st_size == 0:
            raise ValueError("is an empty file (0 bytes)")
        return "file", str(path)
    if isinstance(source, np.ndarray) and source.ndim == 4:
        return "frames", list(source)
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("is empty (no frames)")
        return "frames", list(source)
    raise ValueError("is not a video: expected a video path, a frame folder, a list of frames, "
                     "encoded bytes or a {bytes, path} dict")


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p.casefold() for p in re.split(r"(\d+)", name)]


def folder_frames(folder: str | Path) -> list[str]:
    """The frame image paths of a frame folder, in natural name order; ValueError (a predicate,
    "holds no frame images") if none."""
    folder = Path(folder)
    frames = [p for p in folder.iterdir()
              if p.suffix.lower() in FRAME_SUFFIXES and not p.name.startswith(".") and p.is_file()]
    if not frames:
        raise ValueError(f"holds no frame images ({', '.join(FRAME_SUFFIXES)})")
    return [str(p) for p in sorted(frames, key=lambda p: _natural(p.name))]


def _frame_image(frame: Any, k: int) -> Image.Image:
    """Frame `k` of a list as an RGB PIL image."""
    if isinstance(frame, Image.Image):
        return frame.convert("RGB")
    if isinstance(frame, np.ndarray):
        if frame.ndim not in (2, 3) or frame.dtype != np.uint8:
            raise ValueError(f"has frame {k} as a {frame.dtype} array of shape {frame.shape}; "
                             "frames are HxWxC uint8")
        return Image.fromarray(frame).convert("RGB")
    if isinstance(frame, (str, os.PathLike)):
        try:
            with Image.open(frame) as im:
                return im.convert("RGB")
        except FileNotFoundError:
            raise ValueError(f"lacks frame {k}: {frame} not found") from None
        except Exception as err:  # noqa: BLE001 - PIL raises many types for bad files
            raise ValueError(f"has frame {k} ({frame}), which cannot be decoded "
                             f"({type(err).__name__}: {err})") from None
    raise ValueError(f"has frame {k} as a {type(frame).__name__}; frames are image paths, PIL "
                     "images or HxWxC uint8 arrays")


def _clip_of_frames(frames: list[Any], fps: float, max_frames: int) -> Clip:
    indices = sample_indices(len(frames), fps, fps, max_frames)
    images = {k: _frame_image(frames[k], k) for k in sorted(set(indices))}
    sizes = {im.size for im in images.values()}
    if len(sizes) > 1:
        raise ValueError(f"holds frames of different sizes ({_sizes(sizes)}); the frames of "
                         "one video share one size")
    return Clip([images[k] for k in indices], indices, float(fps), len(frames))


# --- how errors name a video ------------------------------------------------------------------

def _subject(source: Any) -> str:
    """What an error's predicate is about: the path, or what kind of in-memory video."""
    if isinstance(source, dict):
        source = source.get("bytes") if source.get("bytes") is not None else source.get("path")
    if isinstance(source, (str, os.PathLike)):
        return f"frame folder {source}" if Path(source).is_dir() else str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"the in-memory video ({len(source)} bytes)"
    if isinstance(source, (list, tuple)):
        return f"the frame list ({len(source)} frames)"
    return f"the {type(source).__name__}"


def _label(source: Any) -> str:
    """A video as load-time problems name it: "video PATH", "in-memory video (N bytes)"."""
    subject = _subject(source)
    return subject.removeprefix("the ") if subject.startswith("the in-memory") \
        else f"video {subject.removeprefix('the ')}"


def _sizes(sizes: set[tuple[int, int]]) -> str:
    return ", ".join(f"{w}×{h}" for w, h in sorted(sizes))


# --- files (PyAV) ------------------------------------------------------------------------------

def _open(source: str | bytes):
    """A PyAV container on a path or bytes, and its first video stream."""
    import av

    try:
        container = av.open(source if isinstance(source, str) else io.BytesIO(source))
    except Exception as err:  # noqa: BLE001 - PyAV raises many FFmpegError kinds for bad data
        raise ValueError(f"cannot be opened as a video ({type(err).__name__}: {err})") from None
    if not container.streams.video:
        container.close()
        raise ValueError("holds no video stream")
    return container, container.streams.video[0]


@dataclass(frozen=True)
class Header:
    """What a video file says about itself before its frames are decoded."""

    total_frames: int
    native_fps: float
    seconds: float


def probe(source: str | bytes, *, count: bool = True) -> Header:
    """A video file's frame count, frame rate and length. The count is the header's, else (webm,
    mkv) counted from the packets, which reads the file but decodes nothing (`count=False`:
    estimated from the length instead). ValueError (a predicate: "cannot be read (...)")."""
    container, stream = _open(source)
    try:
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        seconds = 0.0
        if stream.duration and stream.time_base:
            seconds = float(stream.duration * stream.time_base)
        elif container.duration:
            seconds = container.duration / 1_000_000
        total = int(stream.frames or 0)
        if not total and count:
            total = sum(1 for packet in container.demux(stream) if packet.size)
        native = float(rate) if rate else (total / seconds if seconds and total else 0.0)
        if not total and native and seconds:
            total = max(1, round(seconds * native))
    except Exception as err:  # noqa: BLE001 - demuxing a corrupt file raises FFmpegError kinds
        raise ValueError(f"cannot be read ({type(err).__name__}: {err})") from None
    finally:
        container.close()
    if total < 1:
        raise ValueError("holds no frames")
    if not native > 0:
        raise ValueError("has no frame rate")
    return Header(total, native, seconds or total / native)


def _decoded(source: str | bytes) -> Iterator[Any]:
    """Every frame of a file in presentation order, as PyAV frames."""
    container, stream = _open(source)
    stream.thread_type = "AUTO"
    try:
        yield from container.decode(stream)
    except Exception as err:  # noqa: BLE001 - corrupt data raises FFmpegError kinds mid-stream
        raise ValueError(f"cannot be decoded ({type(err).__name__}: {err})") from None
    finally:
        container.close()


def _frames_at(source: str | bytes, indices: Sequence[int]) -> tuple[dict[int, Image.Image], int]:
    """The frames at `indices` as RGB images, and how many frames were decoded in all."""
    wanted, last = set(indices), max(indices)
    out: dict[int, Image.Image] = {}
    n = 0
    for n, frame in enumerate(_decoded(source), start=1):
        if n - 1 in wanted:
            out[n - 1] = frame.to_image().convert("RGB")
        if n - 1 >= last:
            break
    return out, n


def _clip_of_file(source: str | bytes, fps: float, max_frames: int) -> Clip:
    header = probe(source)
    total = header.total_frames
    indices = sample_indices(total, header.native_fps, fps, max_frames)
    frames, decoded = _frames_at(source, indices)
    if len(frames) < len(set(indices)):        # fewer frames than the header said: sample again
        if decoded < 1:
            raise ValueError("holds no decodable frames")
        total = decoded
        indices = sample_indices(total, header.native_fps, fps, max_frames)
        frames, _ = _frames_at(source, indices)
    return Clip([frames[k] for k in indices], indices, header.native_fps, total)


# --- the load-time check -----------------------------------------------------------------------

def video_problem(source: Any, *, max_seconds: float, max_frames_source: int | None = None,
                  decode: bool = True) -> str | None:
    """The problem with a video, or None when it is usable: it exists, opens, has a video
    stream, lasts at most `max_seconds` (by its header) and holds at most `max_frames_source`
    frames (None: any number). With `decode`, frames are decoded too: a file of at most
    `FULL_DECODE_FRAMES` frames whole, a longer one at its first frame and from its last
    keyframe to the end; a frame folder or list at its first and last frame (every frame's
    header is read, for a size that differs). Frame folders and lists have no frame rate, so
    only their frame count is limited. The message names the path ("video clips/a.mp4 lasts
    ...") or what the in-memory video is."""
    label = _label(source)
    try:
        kind, value = _resolve(source)
        if kind == "frames":
            _frames_check(value, max_frames_source, decode)
            return None
        header = probe(value, count=decode)          # without decode: the header alone
        if header.seconds > max_seconds:
            return (f"{label} lasts {header.seconds:.1f} s, over data.max_video_seconds = "
                    f"{max_seconds:g} s (cut it or raise the limit)")
        if max_frames_source is not None and header.total_frames > max_frames_source:
            raise ValueError(f"holds {header.total_frames} frames, over the limit of "
                             f"{max_frames_source}")
        if decode:
            _decode_check(value, header)
    except (ValueError, OSError) as err:
        return f"{label} {_predicate(err)}"
    return None


def _frames_check(frames: list[Any], max_frames: int | None, decode: bool) -> None:
    """ValueError (a predicate) unless the frames are at most `max_frames`, open, share a size
    and, with `decode`, the first and the last decode."""
    if max_frames is not None and len(frames) > max_frames:
        raise ValueError(f"holds {len(frames)} frames, over the limit of {max_frames}")
    sizes = set()
    for k, frame in enumerate(frames):
        if not isinstance(frame, (str, os.PathLike)):
            sizes.add(_frame_image(frame, k).size)
            continue
        try:
            with Image.open(frame) as im:               # the header only
                sizes.add(im.size)
                if decode and k in (0, len(frames) - 1):
                    im.load()
        except FileNotFoundError:
            raise ValueError(f"lacks frame {k}: {frame} not found") from None
        except Exception as err:  # noqa: BLE001 - PIL raises many types for bad files
            raise ValueError(f"has frame {k} ({frame}), which cannot be decoded "
                             f"({type(err).__name__}: {err})") from None
    if len(sizes) > 1:
        raise ValueError(f"holds frames of different sizes ({_sizes(sizes)})")


def _decode_check(source: str | bytes, header: Header) -> None:
    """Decode the whole file when short, else its first frame and its tail; ValueError if not."""
    if header.total_frames <= FULL_DECODE_FRAMES:
        if not any(True for _ in _decoded(source)):
            raise ValueError("holds no decodable frames")
        return
    if next(_decoded(source), None) is None:
        raise ValueError("holds no decodable frames")
    container, stream = _open(source)
    try:
        tail = max(0.0, header.seconds - 2.0)
        container.seek(int(tail * 1_000_000), backward=True, any_frame=False)
        ok = any(True for _ in container.decode(stream))
    except Exception as err:  # noqa: BLE001 - corrupt data raises FFmpegError kinds
        raise ValueError(f"cannot be decoded at its end ({type(err).__name__}: {err})") from None
    finally:
        container.close()
    if not ok:
        raise ValueError("decodes no frame at its end (truncated?)")


# --- writing -----------------------------------------------------------------------------------

_ENCODERS = {".mp4": ("libx264", "mpeg4"), ".mkv": ("libx264", "mpeg4"),
             ".mov": ("libx264", "mpeg4"), ".avi": ("mpeg4",),
             ".webm": ("libvpx-vp9", "libvpx")}
"""Encoders tried per file suffix, best first."""


def encoder_for(suffix: str) -> str | None:
    """The first encoder this PyAV build has for a file suffix (None: none)."""
    import av

    for name in _ENCODERS.get(suffix.lower(), ()):
        try:
            av.codec.Codec(name, "w")
            return name
        except Exception:  # noqa: BLE001 - UnknownCodecError and kin: not in this build
            continue
    return None


def write_video(path: str | Path, frames: Sequence[Any], fps: float) -> None:
    """Encode `frames` (PIL images or HxWxC uint8 arrays, one size, even sides) as a video file
    at `fps`: H.264 in mp4/mkv/mov (MPEG-4 part 2 where libx264 is missing), MPEG-4 in avi,
    VP9 (else VP8) in webm, all yuv420p at high quality."""
    import av

    path = Path(path)
    codec = encoder_for(path.suffix)
    if codec is None:
        raise ValueError(f"write_video: no encoder for {path.suffix!r} in this PyAV build "
                         f"(suffixes: {', '.join(_ENCODERS)})")
    arrays = [np.asarray(_frame_image(f, k)) for k, f in enumerate(frames)]
    if not arrays:
        raise ValueError(f"write_video {path}: no frames")
    h, w = arrays[0].shape[:2]
    if any(a.shape[:2] != (h, w) for a in arrays) or h % 2 or w % 2:
        raise ValueError(f"write_video {path}: frames must share one size with even sides "
                         f"(yuv420p); the first is {w}×{h}")
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"libx264": {"crf": "8", "preset": "medium"}, "libvpx-vp9": {"crf": "8", "b": "0"},
               "libvpx": {"crf": "4", "b": "4M"}}.get(codec, {"qscale": "2"})
    from fractions import Fraction

    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1000),
                                      options=options)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for a in arrays:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")))
        container.mux(stream.encode())


def container_suffix(data: bytes) -> str:
    """A file suffix for encoded video bytes, by the container PyAV finds (".mp4" when unsure)."""
    container, _ = _open(data)
    try:
        names = container.format.name.split(",")
    finally:
        container.close()
    for name, suffix in (("mp4", ".mp4"), ("webm", ".webm"), ("matroska", ".mkv"),
                         ("avi", ".avi"), ("gif", ".gif")):
        if name in names:
            return suffix
    return ".mp4"
