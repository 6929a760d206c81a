"""TransAnyText reward: how well a predicted HTML patch reproduces the reference patch.

    R = λ_format·format + λ_position·position + λ_translation·translation + λ_style·style

    format       1 when the patch parses (`mmrlvr.patches.schema.parse`) and renders (PIL), else 0
    position     Σ IoU over Hungarian-matched (pred, ref) box pairs / max(#pred, #ref)
    translation  chrF (sacrebleu, 0..1) of the predicted texts against the reference texts, each
                 joined in reading order (top to bottom, left to right); `metric: comet` calls
                 a local COMET checkpoint instead (optional `unbabel-comet`)
    style        Σ over matched pairs of mean(colour, size, weight) / max(#pred, #ref), with
                 colour 1 − ‖Δrgb‖/(255·√3), size max(0, 1 − |Δsize|/size_ref), weight 1 when
                 both or neither are bold

λ (0.1, 0.3, 0.4, 0.2) by default (docs/methods.md); set `weights: {format: .., ...}` in the config.
The patch is read from the completion's last `<answer>…</answer>` block, or the whole
completion when it has no answer tag. An unparsable patch scores 0 on every component and is
counted (`parse_fail` 1 in its dict, and `self.failures`). Boxes are compared in the reference's
canvas: a patch declaring another canvas size is scaled to it first.
"""
from __future__ import annotations

import re

import numpy as np

from mmrlvr.data import Example
from mmrlvr.patches.schema import Patch, PatchError, TextBox, parse

DEFAULT_WEIGHTS = {"format": 0.1, "position": 0.3, "translation": 0.4, "style": 0.2}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_patch(text: str) -> str | None:
    """The patch text of a completion: its last answer block, or all of it without tags."""
    blocks = _ANSWER.findall(text)
    if blocks:
        return blocks[-1].strip() or None
    if "<answer>" in text:            # an opened, never closed answer: fail closed
        return None
    return text.strip() or None


def iou(a: TextBox, b: TextBox) -> float:
    ax0, ay0, ax1, ay1 = a.rect()
    bx0, by0, bx1, by1 = b.rect()
    iw, ih = max(0.0, min(ax1, bx1) - max(ax0, bx0)), max(0.0, min(ay1, by1) - max(ay0, by0))
    inter = iw * ih
    union = a.w * a.h + b.w * b.h - inter
    return inter / union if union > 0 else 0.0


def match_boxes(pred: list[TextBox], ref: list[TextBox]) -> list[tuple[int, int, float]]:
    """Hungarian matching maximising total IoU: (pred index, ref index, IoU) per pair."""
    from scipy.optimize import linear_sum_assignment

    if not pred or not ref:
        return []
    ious = np.array([[iou(p, r) for r in ref] for p in pred])                # [P, R]
    rows, cols = linear_sum_assignment(-ious)
    return [(int(i), int(j), float(ious[i, j])) for i, j in zip(rows, cols)]


def style_score(p: TextBox, r: TextBox) -> dict[str, float]:
    dist = float(np.linalg.norm(np.subtract(p.color, r.color, dtype=float)))
    return {"colour": 1.0 - dist / (255.0 * np.sqrt(3.0)),
            "size": max(0.0, 1.0 - abs(p.size - r.size) / r.size),
            "weight": float(p.bold == r.bold)}


def reading_order(boxes: list[TextBox]) -> str:
    return " ".join(b.text for b in sorted(boxes, key=lambda b: (round(b.y), b.x)))


def chrf(hypothesis: str, reference: str) -> float:
    """Sentence chrF in [0, 1] (sacrebleu's defaults: character 6-grams, β 2)."""
    from sacrebleu.metrics import CHRF

    return CHRF().sentence_score(hypothesis, [reference]).score / 100.0


def renders(patch: Patch, size: tuple[int, int]) -> bool:
    from mmrlvr.patches.render import RenderError, render_layer

    from PIL import Image

    try:
        render_layer(patch, size)
    except (RenderError, OSError, ValueError, MemoryError, Image.DecompressionBombError):
        return False
    return True


class TranslationReward:
    """The weighted sum above; every component is logged."""

    def __init__(self, weights: dict[str, float] | None = None, metric: str = "chrf",
                 comet_model: str = "", comet_batch: int = 8):
        weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        unknown = set(weights) - set(DEFAULT_WEIGHTS)
        if unknown:
            raise ValueError(f"translation reward: unknown weights {sorted(unknown)}; "
                             f"known: {sorted(DEFAULT_WEIGHTS)}")
        if metric not in ("chrf", "comet"):
            raise ValueError(f"translation reward: metric must be 'chrf' or 'comet', got {metric!r}")
        if metric == "comet" and not comet_model:
            raise ValueError("translation reward: metric 'comet' needs comet_model (a local checkpoint)")
        self.name = "translation"
        self.weights = {k: float(weights.get(k, 0.0)) for k in DEFAULT_WEIGHTS}
        self.metric, self.comet_model, self.comet_batch = metric, comet_model, comet_batch
        self._comet = None
        self.failures = 0
        """Completions whose patch did not parse or render, over this reward's lifetime."""

    def _reference(self, example: Example) -> Patch:
        try:
            ref = parse(example.answer)
        except PatchError as err:
            raise ValueError(f"sample {example.id}: the reference patch is invalid: {err}") from None
        w = example.meta.get("width") or ref.width
        h = example.meta.get("height") or ref.height
        return ref.scaled(int(w), int(h)) if w and h else ref

    def _comet_scores(self, example: Example, pairs: list[tuple[str, str]]) -> list[float]:
        if self._comet is None:
            try:
                from comet import load_from_checkpoint
            except ImportError as err:
                raise ImportError("metric 'comet' needs `pip install unbabel-comet`") from err
            self._comet = load_from_checkpoint(self.comet_model)
        src = reading_order(parse(example.meta["source_patch"]).boxes) \
            if example.meta.get("source_patch") else ""
        data = [{"src": src, "mt": hyp, "ref": ref} for hyp, ref in pairs]
        out = self._comet.predict(data, batch_size=self.comet_batch, progress_bar=False)
        return [float(s) for s in out.scores]

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        ref = self._reference(example)
        size = (ref.width or 1, ref.height or 1)
        results: list[dict[str, float]] = []
        pending: list[tuple[int, str, str]] = []          # (row, hypothesis, reference) for COMET
        for text in completions:
            zero = {"overall": 0.0, "format": 0.0, "position": 0.0, "translation": 0.0,
                    "style": 0.0, "parse_fail": 1.0}
            raw = extract_patch(text)
            try:
                pred = parse(raw) if raw is not None else None
            except PatchError:
                pred = None
            if pred is None or not renders(pred, size):
                self.failures += 1
                results.append(zero)
                continue
            if ref.width and ref.height:
                pred = pred.scaled(ref.width, ref.height)
            n = max(len(pred.boxes), len(ref.boxes))
            pairs = match_boxes(pred.boxes, ref.boxes)
            position = sum(v for _, _, v in pairs) / n
            styles = [style_score(pred.boxes[i], ref.boxes[j]) for i, j, _ in pairs]
            style = sum(np.mean(list(s.values())) for s in styles) / n
            hyp, gold = reading_order(pred.boxes), reading_order(ref.boxes)
            translation = chrf(hyp, gold) if self.metric == "chrf" else 0.0
            if self.metric == "comet":
                pending.append((len(results), hyp, gold))
            results.append({"format": 1.0, "position": position, "translation": translation,
                            "style": float(style), "parse_fail": 0.0,
                            "colour": float(np.mean([s["colour"] for s in styles])) if styles else 0.0,
                            "size": float(np.mean([s["size"] for s in styles])) if styles else 0.0,
                            "weight": float(np.mean([s["weight"] for s in styles])) if styles else 0.0})
        if pending:
            for (row, _, _), value in zip(pending, self._comet_scores(example, [(h, g) for _, h, g in pending])):
                results[row]["translation"] = value
        for r in results:
            r.setdefault("colour", 0.0)
            r.setdefault("size", 0.0)
            r.setdefault("weight", 0.0)
            r["overall"] = sum(self.weights[k] * r[k] for k in DEFAULT_WEIGHTS)
        return results
