"""Examples and datasets: the rows every modality, reward and trainer agree on.

A dataset on disk is JSONL, one `Example` per line, with media paths relative to the file.
Local HF datasets (parquet/arrow) load too, and known public layouts (Geometry3K) map their
fields onto `Example`.

Everything a row needs is checked when the split loads, not when the row is drawn hours into a
run: the gold answer is a non-empty string; every image and audio file lies inside the data
file's dir, opens, decodes and is within the size limits (a decompression bomb is refused by
its header, before it is decoded). Bad rows raise `DataError` naming the file, row, sample id
and reason; with `on_error="skip"` they are dropped and recorded in the `LoadReport`, whose
`write(run_dir)` saves them as `skipped_rows.jsonl`.
"""
from mmrlvr.data.loading import (load_dataset, load_jsonl, load_split, load_table,
                                 write_jsonl)
from mmrlvr.data.media import AudioWarning, MediaLimits, read_audio
from mmrlvr.data.rows import (LAYOUTS, DataError, DataWarning, Example, LoadReport, SkippedRow,
                              example_from_row, gold_answer, row_error)

__all__ = ["LAYOUTS", "AudioWarning", "DataError", "DataWarning", "Example", "LoadReport",
           "MediaLimits", "SkippedRow", "example_from_row", "gold_answer", "load_dataset",
           "load_jsonl", "load_split", "load_table", "read_audio", "row_error", "write_jsonl"]
