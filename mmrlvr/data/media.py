"""Media: reading audio clips, in-dataset media (encoded image bytes kept as PIL images that decode
when used, audio bytes decoded to arrays), and the checks every image, audio and video of a split
passes when it loads (exists, decodes, within the size limits; an image's size is read from its
header before it is decoded, so a decompression bomb is refused unopened; a video's length is its
header's, `mmrlvr.data.video.video_problem`) or, in a lazy split, when it is drawn
(`access_problem`)."""
from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrlvr.data.rows import DataError, Example
from mmrlvr.data.video import video_problem


@dataclass(frozen=True)
class MediaLimits:
    """What every media file of a split must satisfy at load (the `data.*` keys of these names)."""

    allow_outside: bool = False
    """Accept absolute paths and paths leading outside the data file's dir."""
    max_image_pixels: int = 64_000_000
    """Largest image, width × height, read from the header before decoding."""
    max_audio_seconds: float = 600.0
    """Longest audio clip."""
    decode: bool = True
    """Open and decode every file (False: only the path and existence checks)."""
    max_video_seconds: float = 600.0
    """Longest video, by its header (last, so the positional constructions above still hold)."""


def _mp(pixels: int) -> str:
    return f"{pixels / 1e6:.3g} MP"


def _check_image_file(path: str, max_pixels: int) -> str | None:
    from PIL import Image

    try:
        with Image.open(path) as im:          # parses the header; nothing is decoded yet
            w, h = im.size
            if w * h > max_pixels:
                return (f"image {path} is {w}×{h} = {_mp(w * h)}, over data.max_image_pixels = "
                        f"{_mp(max_pixels)} (refused before decoding; downscale it or raise the limit)")
            im.load()                         # truncated or corrupt data fails here, not mid-run
    except Image.DecompressionBombError as err:
        return f"image {path} is refused by PIL as a decompression bomb: {err}"
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad files; all mean "cannot decode"
        return f"image {path} cannot be decoded ({type(err).__name__}: {err})"
    return None


def _check_audio_file(path: str, max_seconds: float) -> str | None:
    import numpy as np
    import soundfile as sf

    try:
        info = sf.info(path)                  # the header: length before any decoding
    except Exception as first:  # noqa: BLE001 - a format libsndfile lacks: ask librosa/audioread
        try:
            import librosa

            seconds = float(librosa.get_duration(path=path))
        except Exception:  # noqa: BLE001 - audioread backends raise their own types
            return f"audio {path} cannot be decoded ({first})"
        return _audio_length_problem(path, seconds, max_seconds)
    problem = _audio_length_problem(path, info.frames / info.samplerate if info.samplerate > 0
                                    else 0.0, max_seconds)
    if problem:
        return problem
    try:                                      # decode in blocks, as the run will, with bounded memory
        for block in sf.blocks(path, blocksize=1 << 16, dtype="float32"):
            if not np.isfinite(block).all():
                return f"audio {path} holds NaN or infinite samples (corrupt file?)"
    except Exception as err:  # noqa: BLE001 - libsndfile reports corrupt data in several types
        return f"audio {path} cannot be decoded ({type(err).__name__}: {err})"
    return None


def _audio_length_problem(where: str, seconds: float, max_seconds: float) -> str | None:
    if seconds <= 0:
        return f"audio {where} holds no samples"
    if seconds > max_seconds:
        return (f"audio {where} lasts {seconds:.1f} s, over data.max_audio_seconds = "
                f"{max_seconds:g} s (cut it or raise the limit)")
    return None


def _check_file(kind: str, path: str, limits: MediaLimits) -> str | None:
    """The problem with one media file (a video: or frame folder), or None when it is usable."""
    if kind == "video":
        return video_problem(path, max_seconds=limits.max_video_seconds)
    try:
        size = os.path.getsize(path)
    except OSError as err:
        return f"{kind} {path} cannot be read ({err.strerror or err})"
    if size == 0:
        return f"{kind} {path} is an empty file (0 bytes)"
    if kind == "image":
        return _check_image_file(path, limits.max_image_pixels)
    return _check_audio_file(path, limits.max_audio_seconds)


def _check_in_memory(kind: str, item: Any, limits: MediaLimits) -> str | None:
    """Checks for media already in memory: PIL images (those still encoded, as read from a
    dataset's bytes, are decoded on a copy), arrays, (array, rate) pairs, videos as encoded
    bytes or frame lists."""
    import numpy as np

    if kind == "video":
        return video_problem(item, max_seconds=limits.max_video_seconds, decode=limits.decode)

    if kind == "image":
        from PIL import Image

        if isinstance(item, Image.Image):
            w, h = item.size
        else:
            shape = sorted(np.shape(item))
            if len(shape) < 2:
                return f"in-memory image has shape {np.shape(item)}, not an image"
            w, h = shape[-2:]                 # the two largest dims; channels are the small one
        if w * h > limits.max_image_pixels:
            return (f"in-memory image is {w}×{h} = {_mp(w * h)}, over data.max_image_pixels = "
                    f"{_mp(limits.max_image_pixels)}")
        if _encoded(item) and limits.decode:
            return _decode_problem(item.fp.getvalue(), "in-memory image")
        return None
    if isinstance(item, (tuple, list)) and len(item) == 2 and np.isscalar(item[1]) and item[1] > 0:
        return _audio_length_problem("(in memory)", max(np.shape(item[0]) or (0,)) / item[1],
                                     limits.max_audio_seconds)
    return None                               # a bare array: its rate, so its length, is unknown


def _encoded(item: Any) -> bool:
    """A PIL image opened on in-memory bytes (decoded when first used)."""
    return isinstance(getattr(item, "fp", None), io.BytesIO)


def _decode_problem(data: bytes, what: str) -> str | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    except Image.DecompressionBombError as err:
        return f"{what} is refused by PIL as a decompression bomb: {err}"
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        return f"{what} cannot be decoded ({type(err).__name__}: {err})"
    return None


def image_from_bytes(data: bytes, what: str) -> Any:
    """An encoded image as a PIL image that decodes when first used; ValueError when its header
    cannot be read."""
    from PIL import Image

    try:
        return Image.open(io.BytesIO(data))   # reads the header only
    except Image.DecompressionBombError as err:
        raise ValueError(f"{what} is refused by PIL as a decompression bomb: {err}") from None
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        raise ValueError(f"{what} cannot be decoded ({type(err).__name__}: {err})") from None


def audio_from_bytes(data: bytes, what: str) -> tuple[np.ndarray, int]:
    """An encoded clip (WAV, FLAC, OGG, MP3: what libsndfile reads) as (float32 samples, rate)."""
    import soundfile as sf

    try:
        wave, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    except Exception as err:  # noqa: BLE001 - libsndfile reports bad data in several types
        raise ValueError(f"{what} cannot be decoded ({type(err).__name__}: {err})") from None
    return wave, int(rate)


def access_problem(ex: Example, limits: MediaLimits) -> str | None:
    """The checks a row of a lazy split passes when it is drawn: files exist and are within the
    size limit (read from the header: pixels, a video's length; the adapter reports a file that
    then fails to decode, naming the sample); in-memory images are decoded in place, once, as
    the adapter would; in-memory videos open and are within the length limit."""
    from PIL import Image

    for kind, item in _media_items(ex):
        if kind == "video":
            problem = video_problem(item, max_seconds=limits.max_video_seconds, decode=False)
            if problem:
                return problem
            continue
        if _is_file_ref(item):
            if not os.path.isfile(item):
                return f"{kind} not found: {item}"
            if kind == "image":
                try:
                    with Image.open(item) as im:
                        w, h = im.size
                except Exception as err:  # noqa: BLE001 - PIL raises many types for bad files
                    return f"image {item} cannot be decoded ({type(err).__name__}: {err})"
                if w * h > limits.max_image_pixels:
                    return f"image {item} is {w}×{h}, over data.max_image_pixels"
            continue
        problem = _check_in_memory(kind, item, replace(limits, decode=False))
        if problem is None and _encoded(item):
            try:
                item.load()
            except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
                problem = f"in-memory image cannot be decoded ({type(err).__name__}: {err})"
        if problem:
            return problem
    return None


def _media_items(ex: Example) -> Iterator[tuple[str, Any]]:
    yield from (("image", item) for item in ex.images)
    yield from (("audio", item) for item in ex.audios)
    yield from (("video", item) for item in ex.videos)


def _is_file_ref(item: Any) -> bool:
    return isinstance(item, (str, os.PathLike))


def _key(kind: str, item: Any) -> tuple[str, Any]:
    return (kind, str(item)) if _is_file_ref(item) else (kind, id(item))


@contextlib.contextmanager
def _media_checks(examples: list[Example], limits: MediaLimits
                  ) -> Iterator[Iterator[str | None]]:
    """Yields an iterator over `examples` in order giving each one's first media problem (None
    when all is well). Files are checked once each, and in-memory images decoded, in parallel
    threads (PIL and libsndfile release the GIL while they read and decode); leaving early
    cancels the checks not started."""
    from tqdm.auto import tqdm

    items = list({_key(kind, item): (kind, item) for ex in examples
                  for kind, item in _media_items(ex)}.items())
    # no bar for small splits; tqdm's None turns it off when stderr is not a terminal
    bar = tqdm(total=len(items), desc="checking media", unit="item", leave=False,
               disable=True if len(items) < 1000 else None)
    pool = ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 4),
                              thread_name_prefix="media-check")
    futures: dict[tuple[str, Any], Future] = {}
    for key, (kind, item) in items:
        futures[key] = pool.submit(_check_file if _is_file_ref(item) else _check_in_memory,
                                   kind, str(item) if _is_file_ref(item) else item, limits)
        futures[key].add_done_callback(lambda _: bar.update())

    def first_problem(ex: Example) -> str | None:
        for kind, item in _media_items(ex):
            problem = futures[_key(kind, item)].result()
            if problem:
                return problem
        return None

    try:
        yield (first_problem(ex) for ex in examples)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()


# --- reading audio ------------------------------------------------------------------------

SILENCE_PEAK = 1e-4
"""A clip whose peak amplitude stays below this is reported as silent."""


class AudioWarning(UserWarning):
    """Audio that is used but altered or suspicious (cut, chunked, upsampled, silent)."""


def describe_source(source: Any) -> str:
    """A clip's path, or what kind of in-memory array it is (for messages)."""
    return str(source) if isinstance(source, (str, Path)) else f"<array {type(source).__name__}>"


def read_audio(source: Any, target_sr: int, *, sample: str = "?") -> np.ndarray:
    """One clip as mono float32 at `target_sr`: a file path, an `(array, rate)` pair or an array.

    A bare array is taken to be at `target_sr` already. Errors name the sample and the file.
    """
    where = f"sample {sample}: audio {describe_source(source)}"
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise DataError(f"{where}: file not found")
        wave, sr = _read_file(path, where)
    elif isinstance(source, (tuple, list)) and len(source) == 2 and np.isscalar(source[1]):
        wave, sr = np.asarray(source[0], dtype=np.float32), int(source[1])
    elif isinstance(source, (np.ndarray, torch.Tensor)):
        wave, sr = np.asarray(source, dtype=np.float32), target_sr
    else:
        raise DataError(f"{where}: expected a file path, an (array, sample_rate) pair or an array")
    if sr <= 0:
        raise DataError(f"{where}: invalid sample rate {sr}")
    if wave.ndim == 2:       # soundfile gives [frames, channels]; a (channels, frames) array is rare
        wave = wave.mean(axis=1) if wave.shape[0] >= wave.shape[1] else wave.mean(axis=0)
    elif wave.ndim != 1:
        raise DataError(f"{where}: expected mono or multi-channel audio, got shape {wave.shape}")
    if wave.size == 0:
        raise DataError(f"{where}: the clip is empty (0 samples)")
    if not np.isfinite(wave).all():
        raise DataError(f"{where}: the clip holds NaN or infinite samples (corrupt file?)")
    if sr != target_sr:
        if sr < target_sr:
            warnings.warn(f"{where}: upsampled from {sr} Hz to {target_sr} Hz; it holds nothing "
                          f"above {sr // 2} Hz", AudioWarning, stacklevel=2)
        wave = _resample(wave, sr, target_sr, where)
    if float(np.abs(wave).max()) < SILENCE_PEAK:
        warnings.warn(f"{where}: the clip is silent (peak amplitude below {SILENCE_PEAK})",
                      AudioWarning, stacklevel=2)
    return np.ascontiguousarray(wave, dtype=np.float32)


def _read_file(path: Path, where: str) -> tuple[np.ndarray, int]:
    import soundfile as sf

    try:
        wave, sr = sf.read(str(path), dtype="float32", always_2d=False)
        return wave, int(sr)
    except (RuntimeError, OSError, ValueError, TypeError) as first:   # sf.LibsndfileError is one
        try:
            import librosa

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")      # librosa's audioread fallback warns itself
                wave, sr = librosa.load(str(path), sr=None, mono=True)
            return wave, int(sr)
        except Exception:  # noqa: BLE001 - audioread backends raise their own types: all "cannot decode"
            raise DataError(f"{where}: cannot decode the file ({first})") from None


def _resample(wave: np.ndarray, sr: int, target_sr: int, where: str) -> np.ndarray:
    try:
        import librosa
    except ImportError:
        raise DataError(f"{where}: is at {sr} Hz and the model needs {target_sr} Hz; resampling "
                        "needs librosa (pip install 'mmrlvr[audio]')") from None
    return librosa.resample(wave, orig_sr=sr, target_sr=target_sr)
