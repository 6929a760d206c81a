"""Synthetic medical VQA: chest-film and head-scan-like grayscale images, verifiable questions.

Each image is a `Study`: a modality (`xray`, `ct`, `mri`, each with its own contrast and
texture), an organ (`lung`: a chest with two lung fields, heart, spine; `brain`: a skull,
hemispheres, ventricles), a plane (`axial` or `coronal`; a chest X-ray is a frontal film, called
coronal here) and zero, one or two round lesions (a "nodule" in the lung, a "lesion" in the
brain) of one size (`small`, `large`) on the patient's `left` and/or `right`. Images follow the
radiological convention: the patient's left is on the image's right.

Questions come in VQA-RAD's types, kept apart by `meta.answer_type`:

    closed  presence     Is there a nodule in the left lung?            yes / no
            abnormal     Is there an abnormality in this image?         yes / no
            modality_yn  Is this a CT scan?                             yes / no
            side_mc      Which side is the nodule on? (A-D options)     letter
            modality_mc  What imaging modality was used? (A-D)          letter
    open    organ        Which organ is shown?                          lung / brain
            modality     What imaging modality is this?                 X-ray / CT / MRI
            plane        In which plane is this image taken?            axial / coronal
            position     Where is the lesion?                           left hemisphere, ...
            size         How large is the nodule?                       small / large
            count        How many nodules are there?                    0 / 1 / 2

The answer is drawn first, then a study that fits it. Every row carries `reasoning` (for the SFT
warm start), `choices` for multiple choice (also listed in the prompt as `A. text` lines) and
`meta` with `answer_type`, `question_type`, `family` and the study. Images are unique (position
jitter and texture noise); question/study combinations repeat by design (the space is small).
`make_medvqa` writes `images/`, `train.jsonl`, `test.jsonl` and `info.json`; the same arguments
give the same files.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image, ImageFilter

from mmrlvr.data import Example, write_jsonl
from mmrlvr.core.templates import HELDOUT_TEMPLATES, TRAIN_TEMPLATES, with_options
from mmrlvr.tasks import Task

MODALITY_NAMES = {"xray": "X-ray", "ct": "CT", "mri": "MRI"}
SIDES = ("left", "right")
SIZES = ("small", "large")
# Grey levels per modality (0-255): X-ray air is dark and bone bright; CT like X-ray with a black
# surround; MRI (T1-like) has dark bone and bright fat, so the three read differently.
LEVELS = {
    "xray": dict(bg=12, body=150, lung=55, bone=215, heart=170, lesion=205, brain=120, vent=60,
                 skull=225, fat=150),
    "ct": dict(bg=0, body=115, lung=18, bone=240, heart=135, lesion=185, brain=105, vent=30,
               skull=245, fat=95),
    "mri": dict(bg=0, body=150, lung=10, bone=55, heart=115, lesion=240, brain=165, vent=40,
                skull=35, fat=220),
}
TEXTURE = {"xray": (1.2, 5.0), "ct": (0.0, 9.0), "mri": (0.6, 5.0)}
"""(Gaussian blur radius in px, noise sd in grey levels) per modality."""


@dataclass
class Study:
    modality: str
    organ: str
    plane: str
    lesions: tuple[str, ...]
    """Patient sides with a lesion: (), ("left",), ("right",) or ("left", "right")."""
    size: str
    seed: int
    """Seeds position jitter and texture noise."""

    @property
    def finding(self) -> str:
        return "nodule" if self.organ == "lung" else "lesion"

    @property
    def region(self) -> str:
        return "lung" if self.organ == "lung" else "hemisphere"

    def describe(self) -> str:
        if self.modality == "xray":
            return "This is a frontal (coronal) chest X-ray."
        part = "chest" if self.organ == "lung" else "brain"
        article = "an" if self.plane == "axial" else "a"
        return f"This is {article} {self.plane} {MODALITY_NAMES[self.modality]} of the {part}."

    def findings(self) -> str:
        f = self.finding
        if not self.lesions:
            return f"There is no {f}."
        if len(self.lesions) == 2:
            return f"There are {self.size} {f}s in both {self.region}s."
        return f"There is a {self.size} {f} in the {self.lesions[0]} {self.region}."

    def render(self, size: int = 112) -> Image.Image:
        rng = np.random.default_rng(self.seed)
        lv = LEVELS[self.modality]
        yy, xx = np.mgrid[0:size, 0:size] / size
        img = np.full((size, size), float(lv["bg"]))

        def oval(cx, cy, rx, ry):
            return ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1.0

        jx, jy = rng.uniform(-0.02, 0.02, 2)
        centres = {}
        if self.organ == "lung":
            if self.plane == "coronal":
                img[oval(0.5 + jx, 0.56 + jy, 0.44, 0.46)] = lv["fat"]
                img[oval(0.5 + jx, 0.56 + jy, 0.41, 0.43)] = lv["body"]
                img[(abs(xx - 0.5 - jx) < 0.03) & oval(0.5 + jx, 0.56 + jy, 0.41, 0.43)] = lv["bone"]
                for s, dx in (("right", -0.17), ("left", 0.17)):                # patient side
                    img[oval(0.5 + dx + jx, 0.48 + jy, 0.12, 0.27)] = lv["lung"]
                    centres[s] = (0.5 + dx + jx, 0.48 + jy, 0.07, 0.17)
                if self.modality == "xray":                                      # ribs
                    for y in np.arange(0.28, 0.72, 0.08):
                        img[(abs(yy - y - jy - 0.05 * (xx - 0.5) ** 2) < 0.008) & (img == lv["lung"])] += 30
                img[oval(0.53 + jx, 0.64 + jy, 0.1, 0.11)] = lv["heart"]
            else:
                img[oval(0.5 + jx, 0.5 + jy, 0.46, 0.34)] = lv["fat"]
                img[oval(0.5 + jx, 0.5 + jy, 0.43, 0.31)] = lv["body"]
                for s, dx in (("right", -0.2), ("left", 0.2)):
                    img[oval(0.5 + dx + jx, 0.47 + jy, 0.14, 0.2)] = lv["lung"]
                    centres[s] = (0.5 + dx + jx, 0.47 + jy, 0.07, 0.11)
                img[oval(0.53 + jx, 0.5 + jy, 0.09, 0.09)] = lv["heart"]
                img[oval(0.5 + jx, 0.74 + jy, 0.06, 0.06)] = lv["bone"]          # vertebra
        else:
            cy, ry = (0.5, 0.44) if self.plane == "axial" else (0.45, 0.37)
            img[oval(0.5 + jx, cy + jy, 0.4, ry + 0.02)] = lv["fat"]
            img[oval(0.5 + jx, cy + jy, 0.38, ry)] = lv["skull"]
            img[oval(0.5 + jx, cy + jy, 0.34, ry - 0.04)] = lv["brain"]
            if self.plane == "coronal":
                img[(abs(xx - 0.5 - jx) < 0.07) & (yy > 0.8)] = lv["brain"]      # brainstem
            vy = 0.1 if self.plane == "axial" else 0.07
            for s, dx in (("right", -0.055), ("left", 0.055)):
                img[oval(0.5 + dx + jx, cy + jy, 0.03, vy)] = lv["vent"]
                centres[s] = (0.5 + 3.4 * dx + jx, cy + jy, 0.06, 0.15)
        radius = 0.045 if self.size == "small" else 0.085
        for s in self.lesions:
            x0, y0, ax, ay = centres[s]
            x, y = x0 + rng.uniform(-ax, ax), y0 + rng.uniform(-ay, ay)
            img[oval(x, y, radius, radius)] = lv["lesion"]
        blur, noise = TEXTURE[self.modality]
        pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), mode="L")
        if blur:
            pil = pil.filter(ImageFilter.GaussianBlur(blur * size / 112))
        arr = np.asarray(pil, dtype=np.float32) + rng.normal(0, noise, (size, size))
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), mode="L")


@dataclass
class Item:
    study: Study
    question: str
    answer: str
    reasoning: str
    choices: list[str] | None = None


def _study(rng: random.Random, *, modality=None, organ=None, lesions=None) -> Study:
    organ = organ or rng.choice(("lung", "brain"))
    options = ("ct", "mri") if organ == "brain" else ("xray", "ct", "mri")
    modality = modality or rng.choice(options)
    if modality == "xray" and organ == "brain":
        modality = rng.choice(("ct", "mri"))
    plane = "coronal" if modality == "xray" else rng.choice(("axial", "coronal"))
    if lesions is None:
        lesions = rng.choice([(), ("left",), ("right",), ("left", "right")])
    return Study(modality, organ, plane, tuple(lesions), rng.choice(SIZES), rng.randrange(2 ** 31))


def _with_sides(rng: random.Random, must: str | None = None, never: str | None = None) -> tuple:
    pool = [c for c in [(), ("left",), ("right",), ("left", "right")]
            if (must is None or must in c) and (never is None or never not in c)]
    return rng.choice(pool)


def _letter(choices: list[str], text: str) -> str:
    return chr(65 + choices.index(text))


def gen_presence(rng):
    side, yes = rng.choice(SIDES), rng.random() < 0.5
    st = _study(rng, lesions=_with_sides(rng, must=side) if yes else _with_sides(rng, never=side))
    q = f"Is there a {st.finding} in the {side} {st.region}?"
    return Item(st, q, "yes" if yes else "no", f"{st.describe()} {st.findings()}")


def gen_abnormal(rng):
    abnormal = rng.random() < 0.5
    lesions = rng.choice([("left",), ("right",), ("left", "right")]) if abnormal else ()
    st = _study(rng, lesions=lesions)
    if rng.random() < 0.5:
        return Item(st, "Is there an abnormality in this image?", "yes" if abnormal else "no",
                    f"{st.describe()} {st.findings()}")
    q = "Are the lungs normal?" if st.organ == "lung" else "Is the brain normal?"
    return Item(st, q, "no" if abnormal else "yes", f"{st.describe()} {st.findings()}")


def gen_modality_yn(rng):
    asked = rng.choice(("xray", "ct", "mri"))
    yes = rng.random() < 0.5
    st = _study(rng, modality=asked if yes else rng.choice([m for m in MODALITY_NAMES if m != asked]),
                organ="lung" if asked == "xray" and yes else None)
    q = {"xray": "Is this an X-ray?", "ct": "Is this a CT scan?", "mri": "Is this an MRI?"}[asked]
    return Item(st, q, "yes" if st.modality == asked else "no", st.describe())


def gen_side_mc(rng):
    choices = ["left", "right", "both", "none"]
    rng.shuffle(choices)
    truth = rng.choice(("left", "right", "both", "none"))
    lesions = {"left": ("left",), "right": ("right",), "both": ("left", "right"), "none": ()}[truth]
    st = _study(rng, lesions=lesions)
    return Item(st, f"Which side is the {st.finding} on?", _letter(choices, truth),
                f"{st.describe()} {st.findings()} That is option {_letter(choices, truth)}.", choices)


def gen_modality_mc(rng):
    choices = ["X-ray", "CT", "MRI", "ultrasound"]
    rng.shuffle(choices)
    st = _study(rng, modality=rng.choice(("xray", "ct", "mri")))
    truth = MODALITY_NAMES[st.modality]
    return Item(st, "What imaging modality was used?", _letter(choices, truth),
                f"{st.describe()} That is option {_letter(choices, truth)}.", choices)


def gen_organ(rng):
    st = _study(rng)
    return Item(st, "Which organ is shown?", st.organ, st.describe())


def gen_modality(rng):
    st = _study(rng, modality=rng.choice(("xray", "ct", "mri")))
    return Item(st, "What imaging modality is this?", MODALITY_NAMES[st.modality], st.describe())


def gen_plane(rng):
    st = _study(rng)
    return Item(st, "In which plane is this image taken?", st.plane, st.describe())


def gen_position(rng):
    st = _study(rng, lesions=(rng.choice(SIDES),))
    return Item(st, f"Where is the {st.finding}?", f"{st.lesions[0]} {st.region}",
                f"{st.describe()} {st.findings()}")


def gen_size(rng):
    st = _study(rng, lesions=rng.choice([("left",), ("right",), ("left", "right")]))
    return Item(st, f"How large is the {st.finding}?", st.size, f"{st.describe()} {st.findings()}")


def gen_count(rng):
    st = _study(rng)
    return Item(st, f"How many {st.finding}s are there?", str(len(st.lesions)),
                f"{st.describe()} {st.findings()}")


FAMILIES: dict[str, tuple[Callable[[random.Random], Item], str, str]] = {
    "presence": (gen_presence, "closed", "PRES"),
    "abnormal": (gen_abnormal, "closed", "ABN"),
    "modality_yn": (gen_modality_yn, "closed", "MODALITY"),
    "side_mc": (gen_side_mc, "closed", "POS"),
    "modality_mc": (gen_modality_mc, "closed", "MODALITY"),
    "organ": (gen_organ, "open", "ORGAN"),
    "modality": (gen_modality, "open", "MODALITY"),
    "plane": (gen_plane, "open", "PLANE"),
    "position": (gen_position, "open", "POS"),
    "size": (gen_size, "open", "SIZE"),
    "count": (gen_count, "open", "COUNT"),
}
"""family -> (generator, answer_type, VQA-RAD question_type)."""


def make_item(family: str, rng: random.Random) -> Item:
    if family not in FAMILIES:
        raise ValueError(f"unknown medvqa family {family!r}; known: {list(FAMILIES)}")
    return FAMILIES[family][0](rng)


def to_example(family: str, item: Item, image_path: Path) -> Example:
    _, answer_type, qtype = FAMILIES[family]
    study = {k: v for k, v in asdict(item.study).items() if k != "seed"}
    if not item.study.lesions:
        study["size"] = None                                  # no lesion, no size
    meta: dict[str, Any] = {"family": family, "answer_type": answer_type, "question_type": qtype,
                            "study": study}
    return Example(id=image_path.stem, prompt=with_options(item.question, item.choices),
                   answer=item.answer, images=[str(image_path)], choices=item.choices,
                   reasoning=item.reasoning, meta=meta)


def _split(out_dir: Path, split: str, n: int, rng: random.Random, families: list[str],
           image_size: int) -> tuple[list[Example], dict[str, int]]:
    order = [families[i % len(families)] for i in range(n)]
    rng.shuffle(order)
    examples, counts = [], dict.fromkeys(families, 0)
    for i, family in enumerate(order):
        item = make_item(family, rng)
        path = out_dir / "images" / f"{split}-{i:06d}.png"
        item.study.render(image_size).save(path, format="PNG")
        examples.append(to_example(family, item, path))
        counts[family] += 1
    return examples, counts


def make_medvqa(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 300, seed: int = 0,
                image_size: int = 112, families: list[str] | None = None) -> dict:
    """Write a synthetic medical VQA set to `out_dir`; returns (and saves) its info dict."""
    out_dir = Path(out_dir)
    families = list(families or FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown medvqa families {unknown}; known: {list(FAMILIES)}")
    if image_size < 56:
        raise ValueError(f"image_size must be at least 56 px, got {image_size}")
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"task": "medvqa", "seed": seed, "image_size": image_size,
                            "families": families, "counts": {}}
    for split, n in (("train", n_train), ("test", n_test)):
        examples, counts = _split(out_dir, split, n, random.Random(f"medvqa-{split}-{seed}"),
                                  families, image_size)
        write_jsonl(examples, out_dir / f"{split}.jsonl")
        info["counts"][split] = counts
    info["answer_types"] = {f: FAMILIES[f][1] for f in families}
    info["train_templates"], info["heldout_templates"] = list(TRAIN_TEMPLATES), list(HELDOUT_TEMPLATES)
    (out_dir / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def _convert(spec: str, out_dir: Path) -> dict:
    from mmrlvr.tasks.medvqa_public import convert

    return convert(spec, out_dir)


TASK = Task(
    "synthetic chest-film/CT/MRI-like images with closed and open questions (vision)",
    lambda out, o: make_medvqa(out, n_train=o.n_train, n_test=o.n_test, seed=o.seed,
                               image_size=o.image_size, families=o.families),
    _convert, ("vqarad", "slake", "pathvqa"))
