"""Which part of an HTML patch each completion token writes: style, layout, text or other.

PWSD's claim (TransAnyText) is that the privileged teacher, who sees the source-language patch,
helps most where the source fixes the answer: the style and layout of each box. PWSD logs its
gap, weight and loss per class (`pwsd.py`), so that claim can be read off a run. The classes are
*our reading* of the paper's "style and layout tokens":

    layout   where a box sits: left, top, width, height, text-align, direction (and the root's
             canvas width/height); compact x, y, w, h, a, rtl — the property with its value
    style    how it looks: font-size, font-family, font-weight, color; compact s, f, b, fw, c
    text     a box's text (between its opening tag and the next `<`)
    other    everything else: tags, quotes, `;`, `<think>`…, `<answer>`, whitespace, EOS

Characters are classed by patterns that tolerate a patch cut short or malformed (rollouts often
are); a token takes the class of most of its non-space characters (ties: text, style, layout,
other, in that order), and a token of spaces only is `other`. Token spans come from decoding
the completion's prefixes, so they follow the sampled ids exactly.
"""
from __future__ import annotations

import re

import numpy as np
import torch

CLASSES = ("text", "style", "layout", "other")
"""Class codes are indices into this tuple (the tie order, too)."""
TEXT, STYLE, LAYOUT, OTHER = range(4)
LAYOUT_PROPS = {"left", "top", "width", "height", "text-align", "direction", "position"}
STYLE_PROPS = {"font-size", "font-family", "font-weight", "color"}
LAYOUT_KEYS = {"x", "y", "w", "h", "a", "rtl"}
STYLE_KEYS = {"s", "f", "b", "fw", "c"}

_TAG = re.compile(r"<(div|p)\b([^<>]*)(>|$)", re.IGNORECASE)
_STYLE_ATTR = re.compile(r"""style\s*=\s*(?:"([^"<>]*)|'([^'<>]*)|([^\s"'<>]*))""", re.IGNORECASE)
_DECL = re.compile(r"([A-Za-z-]+)\s*:\s*([^;<>]*)")
_COMPACT = re.compile(r"""([A-Za-z]+)(?:\s*=\s*("[^"]*"?|'[^']*'?|[^\s<>]*))?""")


def char_classes(text: str) -> np.ndarray:
    """Class code [len(text)] per character of a completion (module docstring)."""
    out = np.full(len(text), OTHER, np.int8)
    for tag in _TAG.finditer(text):
        attrs_at = tag.start(2)
        attrs = tag.group(2)
        if tag.group(1).lower() == "div":
            for attr in _STYLE_ATTR.finditer(attrs):
                group = next(g for g in (1, 2, 3) if attr.group(g) is not None)
                base = attrs_at + attr.start(group)
                for decl in _DECL.finditer(attr.group(group)):
                    prop = decl.group(1).lower()
                    code = LAYOUT if prop in LAYOUT_PROPS else STYLE if prop in STYLE_PROPS else OTHER
                    out[base + decl.start():base + decl.end()] = code
        else:
            for attr in _COMPACT.finditer(attrs):
                key = attr.group(1).lower()
                code = LAYOUT if key in LAYOUT_KEYS else STYLE if key in STYLE_KEYS else OTHER
                out[attrs_at + attr.start():attrs_at + attr.end()] = code
        if tag.group(3) == ">":
            end = text.find("<", tag.end())
            end = len(text) if end < 0 else end
            if text[tag.end():end].strip():
                out[tag.end():end] = TEXT
    return out


def token_spans(tokenizer, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded completion and each token's [start, end) in it, from prefix decodes."""
    if not ids:
        return "", []
    prefixes = tokenizer.batch_decode([ids[:k] for k in range(1, len(ids) + 1)],
                                      skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text = prefixes[-1]
    ends = [min(len(p), len(text)) for p in prefixes]
    starts = [0] + ends[:-1]
    return text, [(min(s, e), e) for s, e in zip(starts, ends)]


def token_classes(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Class code [N, C] (int64) per completion token; padding (mask 0) is `other`."""
    out = torch.full(ids.shape, OTHER, dtype=torch.long)
    for r in range(ids.shape[0]):
        n = int(mask[r].sum())
        text, spans = token_spans(tokenizer, ids[r, :n].tolist())
        chars = char_classes(text)
        blank = np.array([c.isspace() for c in text], bool)
        for t, (s, e) in enumerate(spans):
            codes = chars[s:e][~blank[s:e]]
            if len(codes):
                out[r, t] = int(np.bincount(codes, minlength=4).argmax())   # ties: lowest code
    return out


def class_stats(classes: torch.Tensor, mask: torch.Tensor, gap: torch.Tensor,
                weights: torch.Tensor, kl: torch.Tensor) -> dict[str, float]:
    """Per class c with tokens this step: `c/token_frac` (its share of the distilled tokens),
    `c/gap_mean`, `c/weight_mean` and `c/loss` (mean w_t·KL_t over its tokens), so that
    Σ_c token_frac_c·loss_c is PWSD's loss. All inputs [N, C]; no gradient."""
    m = mask.to(kl.dtype)
    tokens = m.sum().clamp(min=1.0)
    classes = classes.to(m.device)
    out: dict[str, float] = {}
    for code, name in enumerate(CLASSES):
        sel = (classes == code).to(m.dtype) * m                                 # [N, C]
        n = sel.sum()
        if n == 0:
            continue
        out[f"{name}/token_frac"] = float(n / tokens)
        out[f"{name}/gap_mean"] = float((gap.detach() * sel).sum() / n)
        out[f"{name}/weight_mean"] = float((weights.detach() * sel).sum() / n)
        out[f"{name}/loss"] = float((weights.detach() * kl.detach() * sel).sum() / n)
    return out
