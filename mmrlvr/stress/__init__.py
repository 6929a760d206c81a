"""Layer 4: robustness stress tests — prompt, image, audio and video operators (`ops`, `ops_audio`,
`ops_video`) and the report with paired statistics (`run`)."""
from mmrlvr.stress.ops import TEXT_AND_IMAGE, Operator, Variant, apply, gold_index
from mmrlvr.stress.ops_audio import operators as _audio_operators
from mmrlvr.stress.ops_video import operators as _video_operators

OPERATORS: dict[str, Operator] = {**TEXT_AND_IMAGE, **_audio_operators(), **_video_operators()}
"""Every operator by name, in report order."""

__all__ = ["OPERATORS", "Operator", "Variant", "apply", "gold_index"]
