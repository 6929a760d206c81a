"""Examples and datasets: the rows every modality, reward and trainer agree on.

A dataset is a JSONL/JSON, parquet or Arrow file, a `datasets` `save_to_disk` dir, a dir of
shards, or `PATH@SPLIT` (`mmrlvr.data.sources`), all local. Its columns become `Example` fields
by a layout (`mmrlvr.data.formats`): mmrlvr's own, TRL's, EasyR1's and ms-swift's are told from
the column names, `data.columns` names them, and `geo3k:`/`steps:` prefixes pick a named one.
Every other column goes to `Example.meta`. Media may be files (paths relative to the data) or in
the dataset itself (image bytes, PIL images, audio arrays, video bytes); a video may also be a
folder or a list of frames (`mmrlvr.data.video`: reading, sampling and checking clips).

Everything a row needs is checked when the split loads, not when the row is drawn hours into a
run: the gold answer is a non-empty string (numbers are converted, with a warning); the prompt is
text or readable chat messages whose `<image>` (`<audio>`, `<video>`) placeholders match the
media; every image, audio and video lies inside the data's dir, opens, decodes and is within the
size limits (a decompression bomb is refused by its header, before it is decoded; a video's length
is its header's). Bad rows raise `DataError` naming the file, row, sample id and reason; with `on_error="skip"` they are dropped and recorded in the
`LoadReport`, whose `write(run_dir)` saves them as `skipped_rows.jsonl`. A dataset bigger than
`LAZY_BYTES` is served lazily (`LazySplit`; `mmrlvr.data.lazy` says what it checks when).
"""
from mmrlvr.data.formats import LAYOUTS, Layout, detect_layout, example_from_row
from mmrlvr.data.lazy import LazySplit
from mmrlvr.data.loading import (LAZY_BYTES, load_dataset, load_jsonl, load_split, load_table,
                                 write_jsonl)
from mmrlvr.data.media import AudioWarning, MediaLimits, read_audio
from mmrlvr.data.rows import (DataError, DataWarning, Example, LoadReport, SkippedRow, gold_answer,
                              row_error)
from mmrlvr.data.video import Clip, read_video, video_problem, write_video

__all__ = ["LAYOUTS", "LAZY_BYTES", "AudioWarning", "Clip", "DataError", "DataWarning", "Example",
           "LazySplit", "Layout", "LoadReport", "MediaLimits", "SkippedRow", "detect_layout",
           "example_from_row", "gold_answer", "load_dataset", "load_jsonl", "load_split",
           "load_table", "read_audio", "read_video", "row_error", "video_problem", "write_jsonl",
           "write_video"]
