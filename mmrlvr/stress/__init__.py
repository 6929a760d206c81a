"""Layer 4: robustness stress tests — prompt, image and audio operators (`ops`, `ops_audio`) and
the report with paired statistics (`run`)."""
from mmrlvr.stress.ops import TEXT_AND_IMAGE, Operator, Variant, apply, gold_index
from mmrlvr.stress.ops_audio import operators as _audio_operators

OPERATORS: dict[str, Operator] = {**TEXT_AND_IMAGE, **_audio_operators()}
"""Every operator by name, in report order."""

__all__ = ["OPERATORS", "Operator", "Variant", "apply", "gold_index"]
