"""Prompts as other trainers write them: a string with `<image>`/`<audio>`/`<video>` placeholders
(TRL, EasyR1, ms-swift), or chat messages (`[{"role": "user", "content": ...}]`, content a string
or a list of parts `{"type": "image"}`, `{"type": "video"}`, `{"type": "text", "text": ...}`;
ShareGPT's `from`/`value` too).

An `Example` holds the question as text and its media in order: the adapter builds the chat
turn and inserts the model's own media tokens. Placeholders are counted (each one stands for the
next image or clip). Where they all stand before the question (`<image>\nHow many…`, or image
parts first) they are stripped: the media go first, as always. Where text comes before one of
them ("Compare <image> and <image>: same colour?"), the question keeps them, as `<image>` /
`<audio>` / `<video>`, and the adapter puts each medium where its marker stands. Literal model tokens are
refused.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

TAGS = {"image": "<image>", "audio": "<audio>", "video": "<video>"}
"""The placeholder each media kind has in TRL/EasyR1/ms-swift prompt text."""
MODEL_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|AUDIO|>")
"""Qwen tokens the processor expands; in a prompt's text they would break the token count."""
_ROLES = {"user": "user", "human": "user", "system": "system", "assistant": "assistant",
          "gpt": "assistant", "model": "assistant"}
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_THINK_TAG = re.compile(r"<think>(.*?)</think>", re.S)


@dataclass
class Prompt:
    """A prompt read from a row: the question text and what it says about media."""

    text: str
    slots: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TAGS, 0))
    """Media placeholders per kind (`<image>` tags and `{"type": "image"}` parts)."""
    inline: dict[str, list[Any]] = field(default_factory=lambda: {kind: [] for kind in TAGS})
    """Media carried by the parts themselves (`{"type": "image", "image": ...}`), in order."""
    system: str | None = None
    """The conversation's system turn, if it had one."""
    assistant: str | None = None
    """The assistant turn after the question (ms-swift: the reference answer/reasoning)."""
    chat: bool = False
    """It was given as chat messages."""


def read_prompt(value: Any, column: str) -> Prompt:
    """A prompt column's value (text or chat messages) as a `Prompt`.

    ValueError names the column and says what was wrong: a list that is not chat messages is
    refused, never turned into the text "[...]".
    """
    if isinstance(value, str):
        return _from_parts([("text", value)])
    if isinstance(value, (list, tuple)):
        return read_messages(list(value), column)
    raise ValueError(f"'{column}' must be text or chat messages, got {type(value).__name__} "
                     f"{_short(value)}")


def read_messages(messages: list[Any], column: str) -> Prompt:
    """Chat messages: system turns, one user turn (the question), then at most one assistant
    turn. Earlier user/assistant exchanges (multi-turn prompts) are refused."""
    if not messages or not all(isinstance(m, dict) and _role_key(m) for m in messages):
        raise ValueError(f"'{column}' is a list but not chat messages "
                         f"([{{\"role\": \"user\", \"content\": ...}}, ...]): got {_short(messages)}")
    system, user, assistant = [], None, None
    for m in messages:
        raw_role = m[_role_key(m)]
        role = _ROLES.get(str(raw_role).lower())
        content = m.get("content", m.get("value"))
        if role is None:
            raise ValueError(f"'{column}': unsupported role {raw_role!r} (system, user, assistant)")
        if role == "system":
            if user is not None:
                raise ValueError(f"'{column}': a system turn after the user turn")
            system.append(_text_of(content, column))
        elif role == "user":
            if user is not None:
                raise ValueError(f"'{column}' holds more than one user turn; a prompt is one "
                                 "question (multi-turn conversations are not supported)")
            user = _parts(content, column)
        else:
            if user is None or assistant is not None:
                raise ValueError(f"'{column}': an assistant turn must follow the one user turn "
                                 "(multi-turn conversations are not supported)")
            assistant = _text_of(content, column)
    if user is None:
        raise ValueError(f"'{column}' holds no user turn")
    prompt = _from_parts(user)
    prompt.system = "\n".join(s for s in system if s) or None
    prompt.assistant = assistant
    prompt.chat = True
    return prompt


def answer_and_reasoning(assistant: str) -> tuple[str, str | None]:
    """An assistant turn as (gold answer, reasoning): `<answer>X</answer>` gives X and the
    `<think>` part (or the text before the tag) as reasoning; untagged text is all answer."""
    found = _ANSWER_TAG.search(assistant)
    if not found:
        return assistant.strip(), None
    think = _THINK_TAG.search(assistant)
    reasoning = (think.group(1) if think else assistant[:found.start()]).strip()
    return found.group(1).strip(), reasoning or None


def reasoning_of(assistant: str) -> str | None:
    """The reasoning part of a reference completion (its `<think>` part, else all of it)."""
    think = _THINK_TAG.search(assistant)
    return (think.group(1) if think else assistant).strip() or None


def unwrap_answer(gold: str) -> str:
    """A gold answer written as `<answer>X</answer>` (ms-swift `solution`s are) is X."""
    found = _ANSWER_TAG.fullmatch(gold.strip())
    return found.group(1).strip() if found else gold.strip()


def _role_key(message: dict) -> str | None:
    return "role" if "role" in message else "from" if "from" in message else None


def _parts(content: Any, column: str) -> list[tuple[str, Any]]:
    """A turn's content as (kind, value) parts: ("text", str), ("image"|"audio"|"video", item or
    None)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)]
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"'{column}': message content must be text or a list of parts, got "
                         f"{type(content).__name__}")
    out: list[tuple[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            out.append(("text", part))
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict) and kind is None:     # {"text": ...} / {"image": ...} alone
            kind = next((k for k in ("text", *TAGS) if part.get(k) is not None), None)
        if kind == "text":
            out.append(("text", part.get("text") or ""))
        elif kind in TAGS:
            out.append((kind, part.get(kind)))
        else:
            raise ValueError(f"'{column}': unsupported content part {_short(part)} "
                             "(text, image, audio and video parts are)")
    return out


def _text_of(content: Any, column: str) -> str:
    return "\n".join(v for k, v in _parts(content, column) if k == "text")


def _from_parts(parts: list[tuple[str, Any]]) -> Prompt:
    prompt = Prompt(text="")
    pieces = []                             # the turn as text, media parts as their tags
    for kind, value in parts:
        if kind == "text":
            pieces.append(value)
            continue
        pieces.append(TAGS[kind])
        if value is not None:
            prompt.inline[kind].append(value)
    text = "\n".join(pieces)
    for token in MODEL_TOKENS:
        if token in text:
            raise ValueError(f"the prompt holds the model token {token!r}; write <image> (or "
                             "<audio>, <video>) where a medium goes, or nothing: the adapter "
                             "inserts the model's own tokens")
    for kind, tag in TAGS.items():
        prompt.slots[kind] = text.count(tag)
    if not interleaved(text):
        for tag in TAGS.values():
            text = text.replace(tag, "")
    prompt.text = re.sub(r"[ \t]{2,}", " ", text).strip()
    return prompt


MARKER = re.compile("|".join(re.escape(t) for t in TAGS.values()))


def interleaved(text: str) -> bool:
    """Some text stands before a media marker: the markers keep their places."""
    return any(MARKER.sub("", text[:m.start()]).strip() for m in MARKER.finditer(text))


def split_at_markers(text: str) -> list[tuple[str, str]]:
    """`text` as ("text", piece) and ("image"|"audio"|"video", tag) parts, in order."""
    kinds = {tag: kind for kind, tag in TAGS.items()}
    out, start = [], 0
    for m in MARKER.finditer(text):
        if text[start:m.start()]:
            out.append(("text", text[start:m.start()]))
        out.append((kinds[m.group(0)], m.group(0)))
        start = m.end()
    if text[start:]:
        out.append(("text", text[start:]))
    return out


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
