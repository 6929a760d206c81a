"""A tool's result as the tokens of the next turn, and the growing context of every trajectory
as a `PromptBatch` the HF engine can continue.

The tool turn is written by the family's chat template: the template is rendered for a
conversation ending in an assistant turn, and again with a `tool` message after it; the
difference is the text between the policy's last token and its next turn (end of turn, the tool
message with its `<tool_response>` or plain wrapping, the assistant header). Media in the tool
message go through the processor as prompt media do (the family's resize and pixel bounds, the
feature extractor's rate), so an image a tool returns becomes image tokens plus `pixel_values`.
Token ids are kept as sampled and appended, never re-tokenised: what the next turn sees and what
the update scores are the same ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mmrlvr.core.types import TOKEN_KEYS, PromptBatch, select

MARK = "\x00MMRLVR-TURN\x00"


@dataclass
class Chunk:
    """Tokens appended to a trajectory with the media tensors they stand for."""

    ids: list[int]
    types: list[int]
    media: dict[str, torch.Tensor] = field(default_factory=dict)


def tool_content(kind: str, text: str) -> list[dict[str, Any]]:
    """The tool message's content parts for a result of `kind`."""
    parts: list[dict[str, Any]] = []
    if kind == "image":
        parts.append({"type": "image"})
    elif kind == "audio":
        parts.append({"type": "audio", "audio": "tool"})   # Qwen2-Audio's template tests the key
    if text or not parts:
        parts.append({"type": "text", "text": text})
    return parts


def tool_turn_text(processor: Any, content: list[dict[str, Any]]) -> str:
    """The text after an assistant turn's last token up to the next assistant turn's first:
    the template's end of turn, the tool message, the generation prompt."""
    user = {"role": "user", "content": [{"type": "text", "text": "q"}]}
    said = {"role": "assistant", "content": [{"type": "text", "text": MARK}]}
    before = processor.apply_chat_template([user, said], tokenize=False)
    after = processor.apply_chat_template([user, said, {"role": "tool", "content": content}],
                                          tokenize=False, add_generation_prompt=True)
    if not after.startswith(before) or MARK not in before:
        raise ValueError("the chat template renders a conversation differently once a tool "
                         "message follows; mmrlvr cannot find the tool turn's text")
    return before[before.index(MARK) + len(MARK):] + after[len(before):]


def encode_turn(policy: Any, example: Any, text: str, image: Any = None,
                audio: tuple | None = None) -> Chunk:
    """`text` (holding the template's placeholder for `image` or `audio`, if given) through the
    policy's processor: its ids, their type ids and the medium's tensors. A medium whose tokens
    do not match its features is a ValueError (the caller turns it into a counted tool error)."""
    processor, family, adapter = policy.processor, policy.family, policy.adapter
    kwargs: dict[str, Any] = {}
    if image is not None:
        if not family.image_token:
            raise ValueError(f"the {family.name} family takes no images")
        pil = adapter.load_image(image, example, processor)
        kwargs = {"images": family.processor_images([[pil]]), **family.processor_kwargs}
    elif audio is not None:
        fe = getattr(processor, "feature_extractor", None)
        if fe is None or not family.audio_token:
            raise ValueError(f"the {family.name} family takes no audio")
        from mmrlvr.data.media import read_audio

        wave = read_audio(audio, int(fe.sampling_rate), sample=example.id)[:int(fe.n_samples)]
        kwargs = {"audio": [wave], "sampling_rate": int(fe.sampling_rate)}
    out = processor(text=[text], return_tensors="pt", add_special_tokens=False, **kwargs)
    out = {k: v for k, v in out.items() if torch.is_tensor(v)}
    ids = out["input_ids"][0].tolist()
    type_key = next((k for k in TOKEN_KEYS if k in out and k not in ("input_ids", "attention_mask")),
                    None)
    types = out[type_key][0].tolist() if type_key else [0] * len(ids)
    media = {k: v for k, v in out.items() if k not in TOKEN_KEYS}
    if image is not None:
        row = family.media_rows(out, [1], processor)[0]
        token = processor.tokenizer.convert_tokens_to_ids(family.image_token)
        want = family.image_features(out, row, processor)
        if ids.count(token) != want:
            raise ValueError(f"the image gave {want} features for {ids.count(token)} tokens")
    return Chunk(ids, types, media)


@dataclass
class Context:
    """One trajectory's state: the prompt row it continues and everything after the prompt."""

    prompt: int
    ids: list[int] = field(default_factory=list)
    train: list[int] = field(default_factory=list)
    """1 on tokens the policy sampled (trained), 0 on forced and tool tokens."""
    types: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    media: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def add(self, ids: list[int], sampled: bool, logp: list[float] | None = None,
            types: list[int] | None = None, media: dict | None = None) -> None:
        self.ids += ids
        self.train += [int(sampled)] * len(ids)
        self.types += types if types is not None else [0] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)
        if media:
            self.media.append(media)


def context_batch(batch: PromptBatch, contexts: list[Context], pad_id: int,
                  with_completion: bool = True) -> PromptBatch:
    """A PromptBatch of the trajectories `contexts`: each row its prompt (un-padded), then, with
    `with_completion`, its tokens so far, left padded; media tensors the prompt's, then the
    tools', in token order. Without `with_completion`, the prompt rows alone with every tool's
    media attached: the rows the update scores the completions after."""
    rows, media_keys = [], sorted({k for r in batch.media_rows for k in r}
                                  | {k for c in contexts for m in c.media for k in m})
    for c in contexts:
        one, one_rows = select(batch, [c.prompt])
        keep = one["attention_mask"][0].bool()
        tokens = {k: one[k][0][keep].tolist() for k in TOKEN_KEYS if k in one}
        if with_completion:
            tokens["input_ids"] += c.ids
            tokens["attention_mask"] += [1] * len(c.ids)
            for k in TOKEN_KEYS[2:]:
                if k in tokens:
                    tokens[k] += c.types
        pieces = {k: [one[k][slice(*one_rows[0][k])]] for k in one_rows[0]}
        for chunk in c.media:
            for k, v in chunk.items():
                pieces.setdefault(k, []).append(v)
        rows.append((tokens, pieces))
    width = max(len(t["input_ids"]) for t, _ in rows)
    inputs: dict[str, Any] = {}
    for key in rows[0][0]:
        fill = pad_id if key == "input_ids" else 0
        inputs[key] = torch.tensor([[fill] * (width - len(t[key])) + t[key] for t, _ in rows],
                                   dtype=batch.inputs[key].dtype)
    media_rows, offsets = [], dict.fromkeys(media_keys, 0)
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in media_keys}
    for _, pieces in rows:
        row = {}
        for k, vs in pieces.items():
            n = sum(v.shape[0] for v in vs)
            row[k] = (offsets[k], offsets[k] + n)
            offsets[k] += n
            parts[k] += vs
        media_rows.append(row)
    for k, vs in parts.items():
        if vs:
            inputs[k] = torch.cat(vs, dim=0)
    examples = [batch.examples[c.prompt] for c in contexts]
    return PromptBatch(examples, inputs, media_rows, [], batch.prompt_options)
