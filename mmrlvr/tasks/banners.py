"""Banners: synthetic product banners and labels with their text as HTML patches (TransAnyText).

Each item is drawn from a source-language patch (1-3 single-line boxes: headline, subline, tag)
over a flat or gradient background with a simple product shape, and carries the target-language
reference patch: the same boxes with the phrase table's translation, the font size shrunk where
the translation would not fit its box (what a human translator does). Rows:

    prompt     the image + target language (`modalities.image_translation.instruction`)
    answer     the target-language patch (canonical HTML, `mmrlvr.patches.schema.to_html`; with
               `compact=True` the compact `<p>` form, `mmrlvr.patches.schema.to_compact`, about half the tokens)
    reasoning  the source texts and the plan (the `<think>` part of SFT targets)
    meta       source/target language, the source patch, canvas size, layout, and
               `vision_labels` ({role: source text}, what `mmrlvr pretrain-vision` reads)

The phrase table is built in (English into German, French, Spanish and Russian — Cyrillic,
drawn with DejaVu); phrases with a number slot get the same number in every language.
`make_banners` writes `images/*.png`, `train.jsonl`, `test.jsonl`, `info.json`; the same
arguments give byte-identical files.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from mmrlvr.data import Example, write_jsonl
from mmrlvr.patches.schema import FONT_FAMILIES, Patch, TextBox, to_compact, to_html
from mmrlvr.patches.render import render_patch, text_width
from modalities.image_translation import instruction, language_name
from mmrlvr.tasks import Task

PAIRS: tuple[str, ...] = ("en-de", "en-fr", "en-es", "en-ru")
"""Language pairs (source-target) the phrase table covers."""

# role -> list of {lang: phrase}; "{p}" (a percentage) and "{g}" (grams) are filled with one
# number shared by every language
PHRASES: dict[str, list[dict[str, str]]] = {
    "headline": [
        {"en": "Summer Sale", "de": "Sommerschlussverkauf", "fr": "Soldes d'été", "es": "Rebajas de verano", "ru": "Летняя распродажа"},
        {"en": "New Arrivals", "de": "Neuheiten", "fr": "Nouveautés", "es": "Novedades", "ru": "Новинки"},
        {"en": "Winter Collection", "de": "Winterkollektion", "fr": "Collection d'hiver", "es": "Colección de invierno", "ru": "Зимняя коллекция"},
        {"en": "Special Offer", "de": "Sonderangebot", "fr": "Offre spéciale", "es": "Oferta especial", "ru": "Спецпредложение"},
        {"en": "Fresh Bread", "de": "Frisches Brot", "fr": "Pain frais", "es": "Pan fresco", "ru": "Свежий хлеб"},
        {"en": "Organic Coffee", "de": "Bio-Kaffee", "fr": "Café bio", "es": "Café ecológico", "ru": "Органический кофе"},
        {"en": "Gift Ideas", "de": "Geschenkideen", "fr": "Idées cadeaux", "es": "Ideas para regalar", "ru": "Идеи подарков"},
        {"en": "Best Seller", "de": "Bestseller", "fr": "Meilleure vente", "es": "Más vendido", "ru": "Хит продаж"},
        {"en": "Green Tea", "de": "Grüner Tee", "fr": "Thé vert", "es": "Té verde", "ru": "Зелёный чай"},
        {"en": "Olive Oil", "de": "Olivenöl", "fr": "Huile d'olive", "es": "Aceite de oliva", "ru": "Оливковое масло"},
        {"en": "Running Shoes", "de": "Laufschuhe", "fr": "Chaussures de course", "es": "Zapatillas de correr", "ru": "Беговые кроссовки"},
        {"en": "Black Friday", "de": "Black Friday", "fr": "Black Friday", "es": "Black Friday", "ru": "Чёрная пятница"},
    ],
    "subline": [
        {"en": "Free shipping", "de": "Kostenloser Versand", "fr": "Livraison gratuite", "es": "Envío gratis", "ru": "Бесплатная доставка"},
        {"en": "Limited offer", "de": "Begrenztes Angebot", "fr": "Offre limitée", "es": "Oferta limitada", "ru": "Ограниченное предложение"},
        {"en": "Only today", "de": "Nur heute", "fr": "Aujourd'hui seulement", "es": "Solo hoy", "ru": "Только сегодня"},
        {"en": "Handmade", "de": "Handgemacht", "fr": "Fait main", "es": "Hecho a mano", "ru": "Ручная работа"},
        {"en": "Made in Italy", "de": "Hergestellt in Italien", "fr": "Fabriqué en Italie", "es": "Hecho en Italia", "ru": "Сделано в Италии"},
        {"en": "Premium quality", "de": "Premiumqualität", "fr": "Qualité supérieure", "es": "Calidad superior", "ru": "Премиум качество"},
        {"en": "Open every day", "de": "Täglich geöffnet", "fr": "Ouvert tous les jours", "es": "Abierto todos los días", "ru": "Открыто каждый день"},
        {"en": "Save {p}%", "de": "Sparen Sie {p}%", "fr": "Économisez {p} %", "es": "Ahorra un {p}%", "ru": "Скидка {p}%"},
        {"en": "Up to {p}% off", "de": "Bis zu {p}% Rabatt", "fr": "Jusqu'à -{p} %", "es": "Hasta un {p}% de descuento", "ru": "Скидки до {p}%"},
        {"en": "Best price", "de": "Bester Preis", "fr": "Meilleur prix", "es": "Mejor precio", "ru": "Лучшая цена"},
    ],
    "tag": [
        {"en": "Buy now", "de": "Jetzt kaufen", "fr": "Acheter", "es": "Comprar ya", "ru": "Купить"},
        {"en": "Shop now", "de": "Jetzt shoppen", "fr": "Découvrir", "es": "Compra ahora", "ru": "В магазин"},
        {"en": "New", "de": "Neu", "fr": "Nouveau", "es": "Nuevo", "ru": "Новинка"},
        {"en": "Sale", "de": "Sale", "fr": "Promo", "es": "Oferta", "ru": "Скидка"},
        {"en": "-{p}%", "de": "-{p}%", "fr": "-{p} %", "es": "-{p}%", "ru": "-{p}%"},
        {"en": "{g} g", "de": "{g} g", "fr": "{g} g", "es": "{g} g", "ru": "{g} г"},
        {"en": "Learn more", "de": "Mehr erfahren", "fr": "En savoir plus", "es": "Más información", "ru": "Подробнее"},
    ],
}

PALETTE: tuple[tuple[int, int, int], ...] = (
    (246, 214, 92), (236, 112, 99), (88, 160, 214), (120, 190, 130), (250, 244, 234),
    (40, 48, 72), (170, 120, 200), (240, 150, 60), (230, 230, 236), (24, 110, 100))
INKS_DARK: tuple[tuple[int, int, int], ...] = ((20, 20, 24), (140, 20, 30), (16, 40, 96), (60, 40, 20))
INKS_LIGHT: tuple[tuple[int, int, int], ...] = ((255, 255, 255), (255, 236, 160), (210, 240, 255))


def _luma(c: tuple[int, int, int]) -> float:
    return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]


def _background(rng: random.Random, size: tuple[int, int]) -> tuple[Image.Image, tuple[int, int, int]]:
    """A flat or vertical-gradient background with one simple product shape; returns its mean colour."""
    w, h = size
    top = rng.choice(PALETTE)
    bottom = rng.choice(PALETTE) if rng.random() < 0.5 else top
    if _luma(top) > 140 and _luma(bottom) < 110 or _luma(top) < 110 and _luma(bottom) > 140:
        bottom = top          # one ink colour must read on the whole background
    img = Image.new("RGB", size, top)
    draw = ImageDraw.Draw(img)
    for y in range(h):
        t = y / max(h - 1, 1)
        draw.line([(0, y), (w, y)], fill=tuple(round(a + (b - a) * t) for a, b in zip(top, bottom)))
    # a product stand-in at one side, faint so text over it stays readable
    r = rng.randint(h // 5, h // 3)
    cx = rng.choice((r + 2, w - r - 2))
    cy = rng.randint(r, h - r)
    shade = tuple(max(0, min(255, c + rng.choice((-28, 28)))) for c in top)
    if rng.random() < 0.5:
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=shade)
    else:
        draw.rounded_rectangle((cx - r, cy - r, cx + r, cy + r), radius=r // 3, fill=shade)
    mean = tuple(round((a + b) / 2) for a, b in zip(top, bottom))
    return img, mean


def _fit_size(box: TextBox, text: str, start: int, floor: int = 6) -> int:
    """The largest integer size <= start at which `text` fits the box width."""
    size = start
    probe = TextBox(text, box.x, box.y, box.w, box.h, size, box.font, box.weight)
    while size > floor and text_width(probe, size) > box.w:
        size -= 1
    return size


def make_banner(rng: random.Random, pair: str, size: tuple[int, int], compact: bool = False
                ) -> tuple[Image.Image, Patch, Patch, dict[str, Any]]:
    """One banner: (rendered image, source patch, target patch, meta)."""
    src, tgt = pair.split("-")
    w, h = size
    background, mean = _background(rng, size)
    inks = INKS_DARK if _luma(mean) > 128 else INKS_LIGHT
    roles = ["headline"] + rng.sample(["subline", "tag"], rng.randint(0, 2))
    nums = {"p": rng.choice((10, 15, 20, 25, 30, 40, 50, 70)), "g": rng.choice((100, 250, 500))}
    align = rng.choice(("left", "center", "right"))
    margin = max(2, w // 20)
    box_w = w - 2 * margin
    scale = {"headline": 0.22, "subline": 0.14, "tag": 0.13}
    src_boxes, tgt_boxes = [], []
    heights = [round(scale[r] * h * 1.35) for r in roles]
    gap = max(1, h // 24)
    y = max(0, (h - sum(heights) - gap * (len(roles) - 1)) // 2 + rng.randint(-gap, gap))
    for role, bh in zip(roles, heights):
        entry = rng.choice(PHRASES[role])
        s_text, t_text = entry[src].format(**nums), entry[tgt].format(**nums)
        font = rng.choice(FONT_FAMILIES[:4])
        weight = 700 if role == "headline" or rng.random() < 0.3 else 400
        colour = rng.choice(inks)
        start = max(6, round(scale[role] * h))
        proto = TextBox(s_text, margin, y, box_w, bh, start, font, weight, colour, align)
        s_size = _fit_size(proto, s_text, start)
        t_size = _fit_size(proto, t_text, s_size)
        src_boxes.append(TextBox(s_text, margin, y, box_w, bh, s_size, font, weight, colour, align))
        tgt_boxes.append(TextBox(t_text, margin, y, box_w, bh, t_size, font, weight, colour, align))
        y += bh + gap
    source, target = Patch(src_boxes, w, h), Patch(tgt_boxes, w, h)
    meta = {"source_lang": src, "target_lang": tgt, "pair": pair, "roles": roles,
            "source_patch": to_compact(source) if compact else to_html(source), "width": w, "height": h,
            "vision_labels": {role: b.text for role, b in zip(roles, src_boxes)}}
    return render_patch(source, background), source, target, meta


def reasoning(source: Patch, src: str, tgt: str) -> str:
    texts = " | ".join(b.text for b in source.boxes)
    return (f"{len(source.boxes)} text box{'es' if len(source.boxes) > 1 else ''} in "
            f"{language_name(src)}: {texts}. I translate each into {language_name(tgt)} and keep "
            "its box, font, weight and colour.")


def make_example(rng: random.Random, pair: str, image_path: Path, size: tuple[int, int],
                 compact: bool = False) -> Example:
    """Draw one banner for `pair`, save its PNG at `image_path`, return the Example."""
    image, source, target, meta = make_banner(rng, pair, size, compact)
    image_path.parent.mkdir(parents=True, exist_ok=True)
    image.save(image_path, format="PNG")
    src, tgt = pair.split("-")
    return Example(id=image_path.stem, prompt=instruction(tgt, compact=compact),
                   answer=to_compact(target) if compact else to_html(target),
                   images=[str(image_path)], reasoning=reasoning(source, src, tgt),
                   meta={"family": pair, **meta})


def make_banners(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
                 width: int = 224, height: int = 112, pairs: list[str] | None = None,
                 compact: bool = False) -> dict[str, Any]:
    """Write a banners dataset (pairs dealt in turn, so each split is balanced over them)."""
    pairs = list(pairs or PAIRS)
    for p in pairs:
        src, _, tgt = p.partition("-")
        if p not in PAIRS and not (src in PHRASES["headline"][0] and tgt in PHRASES["headline"][0]):
            raise ValueError(f"unknown language pair {p!r}; the phrase table covers {list(PAIRS)}")
    if width < 56 or height < 28:
        raise ValueError(f"banners need at least 56x28 px, got {width}x{height}")
    out = Path(out_dir)
    info: dict[str, Any] = {"task": "banners", "seed": seed, "width": width, "height": height,
                            "pairs": pairs, "patch_form": "compact" if compact else "html"}
    for split, count in (("train", n_train), ("test", n_test)):
        rows = []
        for i in range(count):
            rng = random.Random(f"banners-{seed}-{split}-{i}")
            pair = pairs[i % len(pairs)]
            rows.append(make_example(rng, pair, out / "images" / f"{split}-{i:05d}.png",
                                     (width, height), compact))
        write_jsonl(rows, out / f"{split}.jsonl")
        info[f"n_{split}"] = count
    (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


TASK = Task(
    "product banners to translate as HTML patches, en->de/fr/es/ru (image translation)",
    lambda out, o: make_banners(out, n_train=o.n_train, n_test=o.n_test, seed=o.seed,
                                width=2 * o.image_size, height=o.image_size, pairs=o.families,
                                compact=o.compact))
