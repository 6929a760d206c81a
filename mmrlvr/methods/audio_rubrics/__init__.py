"""AudioRubrics: self-evolving, audio-grounded rubric rewards (docs/audio.md).

Acoustic evidence measured on the waveform (`evidence.py`), rubric checks (`checks.py`), judges
(`judges.py`: the rule judge, and an LLM judge through `llm.py`), the rubric writer (`writer.py`)
and the reward (`reward.py`, reward `audio_rubrics`). Off: the reward not named.
"""
from __future__ import annotations

from rewards import REWARDS

REWARDS.register("audio_rubrics", "mmrlvr.methods.audio_rubrics.reward:AudioRubricsReward")
