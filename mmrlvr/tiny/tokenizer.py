"""The tiny models' tokenizers: a byte-level BPE of about 600 tokens trained here, offline, on a
small built-in English corpus (plus any task text), carrying every Qwen2-VL / Qwen2-Audio special
token with its exact string and the family's real chat template; and `instantiate_and_save`,
the seeded random init every tiny family shares. Nothing touches the network.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

QWEN_VL_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""The Qwen2-VL / Qwen2.5-VL added tokens, in the order of their ids in the real vocabulary."""

QWEN_AUDIO_SPECIAL_TOKENS: tuple[str, ...] = ("<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>")
"""Qwen2-Audio's extra added tokens (audio start/end and the audio placeholder)."""

QWEN_SPECIAL_TOKENS: tuple[str, ...] = QWEN_VL_SPECIAL_TOKENS + QWEN_AUDIO_SPECIAL_TOKENS
"""Every special token the tiny Qwen tokenizers carry (the same recipe serves VL and Audio)."""

# Qwen2-VL-*-Instruct's chat_template.json (identical for Qwen2.5-VL-*-Instruct), verbatim.
QWEN2_VL_CHAT_TEMPLATE: str = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2's real pre-tokenizer regex (transformers' Qwen2Tokenizer); `\p{N}` isolates every digit.
_QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_GENERIC_ENGLISH = """\
You are a helpful assistant. The user asks a question about a picture and the assistant answers.
Think step by step, then give the final answer. Look at the image carefully before you answer.
The answer is short: a number, a colour, a shape, a side, or yes or no.
This is a simple task. Please answer the question. What do you see in this picture?
A small model can learn to count, to compare and to add when the reward is verifiable.
First describe what is in the image, then reason about it, and finally write the answer.
The image shows a few coloured shapes on a white or gray background.
Which one is bigger? Where is it? Is it above or below, inside or outside, near or far?
I think the answer is correct because each step follows from the one before it.
Let me check again. That is right. That is wrong. The result is the same.
Question: Answer: Reasoning: Step 1: Step 2: Step 3: Final answer:
The patient has a normal chest x-ray. Is there an abnormality in this scan? The organ is the liver.
Listen to the audio clip. What sound is heard? Which instrument is playing? The speaker says hello.
Translate the text in the image into English. The sign says stop. The word is written in black.
one two three four five six seven eight nine ten zero first second third last more less than
and or not the a an is are was were be it this that these those there here of in on at to from
with without for by as if then so because but also only each every all some none many few
"""


def _plural(kind: str, n: int) -> str:
    return kind if n == 1 else kind + "s"


def _be(n: int) -> str:
    return "is" if n == 1 else "are"


def base_corpus() -> list[str]:
    """The built-in training text: the synthetic tasks' vocabulary, chat words, tags, numbers.

    Deterministic (no randomness), a few thousand short lines; the task phrases repeat so BPE
    merges them into few tokens.
    """
    shapes = ("circle", "square", "triangle")
    colours = ("red", "green", "blue", "yellow")
    lines: list[str] = []
    # chat scaffolding and reasoning tags, as plain text (the special tokens are added separately)
    for _ in range(20):
        lines += [
            "system", "user", "assistant", "You are a helpful assistant.", "Picture 1:", "Picture 2:",
            "Video 1:", "<think>", "</think>", "<answer>", "</answer>",
            "<think>I see 2 red circles. 2 + 1 = 3.</think><answer>3</answer>",
            "<think> There are 2 red circles. </think> <answer> 2 </answer>",
            "<think>\nThe red circle is on the left.\n</think>\n<answer>left</answer>",
            "Output the thinking process in <think> </think> and the final answer in <answer> </answer> tags.",
            "Put the final answer in <answer> </answer>.",
            "\\boxed{3}", "The answer is \\boxed{yes}.",
        ]
    # the synthetic shape tasks
    questions = [
        "How many shapes are in the image?", "What colour is the shape?", "What color is the shape?",
        "What shape is in the image?", "Is the red circle on the left or the right?",
        "How many more circles than squares?", "How many more circles than squares are there?",
        "How many circles plus squares are there?",
    ]
    lines += questions * 10
    for c, k in itertools.product(colours, shapes):
        lines += [
            f"How many {c} shapes are there?", f"Is there a {c} {k} in the image?",
            f"There is a {c} {k}.", f"There is no {c} {k}.", f"I see 1 {c} {k}. Its colour is {c}.",
            f"I see 1 {c} {k}. It is a {k}.", f"It is a {k}.", f"Its colour is {c}.",
            f"The {c} {k} is on the left.", f"The {c} {k} is on the right.",
            f"Is the {c} {k} on the left or the right?",
        ]
        for n in range(0, 6):
            lines.append(f"There {_be(n)} {n} {c} {_plural(k, n)}.")
            lines.append(f"I see {n} {c} {_plural(k, n)}. That is {n} {_plural('shape', n)}.")
    for a, b in itertools.product(shapes, shapes):
        if a != b:
            lines.append(f"How many more {a}s than {b}s are there?")
            lines.append(f"How many {a}s plus {b}s are there?")
    for a in range(0, 10):
        for b in range(0, 10):
            lines.append(f"{a} + {b} = {a + b}.")
            if a >= b:
                lines.append(f"{a} - {b} = {a - b}")
    lines += [str(n) for n in range(0, 1001)]
    lines += ["yes", "no", "left", "right", "Yes", "No", "Left", "Right"] * 5
    lines += _GENERIC_ENGLISH.splitlines() * 3
    return lines


def _bpe_size(vocab_target: int, special_tokens: list[str], named: Sequence[str | None]) -> int:
    """The BPE share of `vocab_target`, once every named token is checked to be among `special_tokens`."""
    for t in named:
        if t is not None and t not in special_tokens:
            raise ValueError(f"{t!r} must be one of special_tokens")
    n_bpe = vocab_target - len(special_tokens)
    if n_bpe < 256:
        raise ValueError(f"vocab_target {vocab_target} leaves {n_bpe} < 256 BPE tokens (the byte alphabet)")
    return n_bpe


def _train_bpe(n_bpe: int, special_tokens: list[str], extra_corpus: Sequence[str] | None):
    """Qwen2's byte-level BPE recipe trained on `base_corpus()` + `extra_corpus`, specials appended."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    corpus = base_corpus() + list(extra_corpus or [])
    tk.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    tk.add_special_tokens([
        AddedToken(t, special=True, normalized=False, single_word=False, lstrip=False, rstrip=False)
        for t in special_tokens
    ])
    return tk


def build_tokenizer(
    out_dir: str | Path | None = None,
    extra_corpus: Sequence[str] | None = None,
    vocab_target: int = 600,
    special_tokens: Sequence[str] = QWEN_SPECIAL_TOKENS,
    *,
    chat_template: str | None = QWEN2_VL_CHAT_TEMPLATE,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
    model_max_length: int = 4096,
    bos_token: str | None = None,
    unk_token: str | None = None,
    **tokenizer_kwargs,
):
    """Train a byte-level BPE tokenizer offline and wrap it as a transformers fast tokenizer.

    The recipe is Qwen2's: NFC normaliser, Qwen2's split regex (which isolates each digit, so
    numbers are always one token per digit) then byte-level mapping, byte-level decoder, no BOS.
    The 256 byte symbols are always in the vocabulary, so any text encodes. `special_tokens` are
    appended after the BPE vocabulary as special added tokens with their exact strings (never
    split, never merged). Left padding with `pad_token`; `eos_token` ends an assistant turn.

    Args:
        out_dir: where to `save_pretrained` the tokenizer (None: don't save).
        extra_corpus: more training lines, added to `base_corpus()`.
        vocab_target: total vocabulary size wanted, special tokens included (>= 256 + specials).
        special_tokens: added tokens, in id order; must include `eos_token` and `pad_token`.
        chat_template: jinja template stored on the tokenizer (the Qwen2-VL one by default).
        bos_token, unk_token: the family's, if it has them (Qwen has neither; Gemma `<bos>` and
            `<unk>`); must be among special_tokens.
        tokenizer_kwargs: more `PreTrainedTokenizerFast` arguments, only where a family needs them
            (e.g. Gemma's `add_bos_token=True`).
    Returns:
        the `PreTrainedTokenizerFast`; `len(tok)` is the size the model's embedding must have.
    """
    from transformers import PreTrainedTokenizerFast

    special_tokens = list(dict.fromkeys(special_tokens))
    n_bpe = _bpe_size(vocab_target, special_tokens, (eos_token, pad_token, bos_token, unk_token))
    tk = _train_bpe(n_bpe, special_tokens, extra_corpus)

    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=unk_token,
        bos_token=bos_token,
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
        chat_template=chat_template,
        **tokenizer_kwargs,
    )
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(str(out_dir))
    return tok


TINY_MAX_NEW_TOKENS = 64
"""The completion budget a tiny model's generation_config.json carries: what a config that
leaves `rollout.max_new_tokens` at 0 ("the model's") runs with on a laptop."""


def instantiate_and_save(model_cls, config, tok, processor, out: Path, seed: int):
    """Seeded float32 random init on CPU (global RNG untouched), Qwen generation defaults
    (eos <|im_end|>, pad/bos <|endoftext|>) with a small completion budget
    (`TINY_MAX_NEW_TOKENS`), then processor and model saved into `out`
    (`mmrlvr.tiny.common.save_seeded` with the Qwen ids)."""
    from mmrlvr.tiny.common import save_seeded

    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    return save_seeded(model_cls, config, processor, out, seed, bos_token_id=eot, eos_token_id=im_end,
                       pad_token_id=eot, max_new_tokens=TINY_MAX_NEW_TOKENS)
