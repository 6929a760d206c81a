"""AudioRubrics: self-evolving, audio-grounded rubric rewards (docs/audio.md).

Acoustic evidence measured on the waveform (`evidence.py`), rubric checks (`checks.py`), judges
(`judges.py`: the rule judge, and a text LLM judge through `llm.py`), the writer and judge specs
and the judge that hears the audio (`roles.py`), the models behind them (`hearing.py`: an audio
LM in process, `policy`, an endpoint taking audio), the group arithmetic of a heard judgement
(`heard.py`), the rubric writer and its cache (`writer.py`) and the reward (`reward.py`, reward
`audio_rubrics`); `check.py`: `mmrlvr check-method audio_rubrics` (how many criteria split the
starting model's groups). Off: the reward not named (plain GRPO); `writer: rules, judge: rule` (the
defaults) is the offline librosa-and-rules path.
"""
from __future__ import annotations

from mmrlvr.core.registry import METHOD_CHECKS
from rewards import REWARDS

REWARDS.register("audio_rubrics", "mmrlvr.methods.audio_rubrics.reward:AudioRubricsReward")
METHOD_CHECKS.register("audio_rubrics", "mmrlvr.methods.audio_rubrics.check:check")
