"""HTML patches: the constrained HTML a TransAnyText model writes, parsed, checked and written back.

A patch is a list of absolutely positioned, single-line text boxes over an image::

    <div class="patch" style="width:224px;height:112px">
      <div style="left:12px;top:8px;width:200px;height:30px;font-family:'DejaVu Sans';
                  font-size:22px;font-weight:700;color:#1a2b3c;text-align:center;direction:ltr">Sommerschlussverkauf</div>
    </div>

The root `<div class="patch">` is optional; when present its `width`/`height` name the pixel
space the boxes live in (an image of another size scales them). Each box is a `<div>` whose
`style` may hold exactly these properties (anything else is an error):

    left, top, width, height   px, required (`position: absolute` is implied; writing it is allowed)
    font-size                  px, required
    font-family                one of `FONT_FAMILIES` (or the generic `sans-serif`/`serif`/`monospace`)
    font-weight                100..900, `normal` (400) or `bold` (700)
    color                      `#rgb`, `#rrggbb` or `rgb(r, g, b)`
    text-align                 left | center | right
    direction                  ltr | rtl

The box text is plain text (HTML entities decoded); nested tags are errors. Every error is a
`PatchError` naming the box (1-based) and the property, and says what is allowed.

Compact form. A box may also be written as a `<p>` with short attributes, for models whose
tokenizer makes the full style string long (with a 1,500-token BPE trained on the banners, en-de
patches average 73 tokens against 139 as canonical HTML)::

    <p x=12 y=8 w=200 h=30 s=22 f=serif b c=1a2b3c a=c>Sommerschlussverkauf</p>

    x y w h s        left, top, width, height, font-size (px, required)
    f                sans | serif | mono | lsans | lserif  (`COMPACT_FONTS`; default sans)
    b                bold (700); `fw=N` any other weight (default 400)
    c                colour as 3 or 6 hex digits, `#` optional (default 000000)
    a                l | c | r (default l);  rtl  right-to-left (default ltr)

It means exactly the canonical `<div style=...>` box (same validation, same errors); `to_compact`
writes it, `to_html` turns any patch into the canonical HTML a browser renders.
Layout rules shared by both renderers (`mmrlvr.patches.render`): one line, no wrapping, no clipping;
the line box is the box height (CSS `line-height: h`), so the glyphs sit vertically centred by
the font's ascent/descent; `text-align` places the line within the box width.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser

FONT_FAMILIES: tuple[str, ...] = ("DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono",
                                  "Liberation Sans", "Liberation Serif")
"""Font families a patch may name (installed system fonts, so both renderers find the same file)."""
GENERIC_FAMILIES = {"sans-serif": "DejaVu Sans", "serif": "DejaVu Serif", "monospace": "DejaVu Sans Mono"}
COMPACT_FONTS: dict[str, str] = dict(zip(("sans", "serif", "mono", "lsans", "lserif"), FONT_FAMILIES))
"""Font codes of the compact form (`f=`), one per `FONT_FAMILIES` entry."""
COMPACT_ALIGNS = {"l": "left", "c": "center", "r": "right"}
COMPACT_KEYS = ("x", "y", "w", "h", "s", "f", "b", "fw", "c", "a", "rtl")
ALIGNS = ("left", "center", "right")
DIRECTIONS = ("ltr", "rtl")
PROPERTIES = ("position", "left", "top", "width", "height", "font-family", "font-size",
              "font-weight", "color", "text-align", "direction")
REQUIRED = ("left", "top", "width", "height", "font-size")


class PatchError(ValueError):
    """A patch that breaks the schema; the message names the box and property."""


@dataclass(frozen=True)
class TextBox:
    """One absolutely positioned line of text. Geometry in pixels of the patch's canvas."""

    text: str
    x: float
    y: float
    w: float
    h: float
    size: float
    """Font size in px (the em size, as in CSS)."""
    font: str = "DejaVu Sans"
    weight: int = 400
    color: tuple[int, int, int] = (0, 0, 0)
    align: str = "left"
    direction: str = "ltr"

    @property
    def bold(self) -> bool:
        return self.weight >= 600

    def rect(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1)."""
        return self.x, self.y, self.x + self.w, self.y + self.h


@dataclass
class Patch:
    boxes: list[TextBox] = field(default_factory=list)
    width: int | None = None
    """Canvas width the boxes are laid out in (None: the image's own)."""
    height: int | None = None

    def scaled(self, width: int, height: int) -> "Patch":
        """The patch in a canvas of `width`×`height` (boxes and font sizes scaled)."""
        if not self.width or not self.height or (self.width, self.height) == (width, height):
            return Patch(list(self.boxes), width, height)
        sx, sy = width / self.width, height / self.height
        boxes = [replace(b, x=b.x * sx, y=b.y * sy, w=b.w * sx, h=b.h * sy, size=b.size * sy)
                 for b in self.boxes]
        return Patch(boxes, width, height)


# ----------------------------------------------------------------------------- values

def _px(value: str, where: str, prop: str, positive: bool) -> float:
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(px)?\s*", value)
    if not m:
        raise PatchError(f"{where}: '{prop}: {value}' must be a number of px, e.g. '{prop}: 12px'")
    v = float(m.group(1))
    if positive and v <= 0:
        raise PatchError(f"{where}: '{prop}: {value}' must be > 0")
    return v


def parse_color(value: str, where: str = "patch") -> tuple[int, int, int]:
    """`#rgb`, `#rrggbb` or `rgb(r, g, b)` -> (r, g, b)."""
    v = value.strip().lower()
    if re.fullmatch(r"#[0-9a-f]{3}", v):
        return tuple(int(c * 2, 16) for c in v[1:])
    if re.fullmatch(r"#[0-9a-f]{6}", v):
        return tuple(int(v[i:i + 2], 16) for i in (1, 3, 5))
    m = re.fullmatch(r"rgb\(\s*(\d{1,3})\s*,\s*(\d{1,3})\s*,\s*(\d{1,3})\s*\)", v)
    if m and all(int(g) <= 255 for g in m.groups()):
        return tuple(int(g) for g in m.groups())
    raise PatchError(f"{where}: 'color: {value}' must be #rgb, #rrggbb or rgb(r, g, b) with 0-255")


def _weight(value: str, where: str) -> int:
    v = value.strip().lower()
    if v in ("normal", "bold"):
        return 400 if v == "normal" else 700
    if re.fullmatch(r"[1-9]00", v):
        return int(v)
    raise PatchError(f"{where}: 'font-weight: {value}' must be normal, bold or 100..900")


def _family(value: str, where: str) -> str:
    first = value.split(",")[0].strip().strip("'\"").strip()
    if first in GENERIC_FAMILIES:
        return GENERIC_FAMILIES[first]
    for fam in FONT_FAMILIES:
        if fam.lower() == first.lower():
            return fam
    raise PatchError(f"{where}: 'font-family: {value}' is not available; use one of "
                     f"{list(FONT_FAMILIES)} or {list(GENERIC_FAMILIES)}")


def parse_style(style: str, where: str) -> dict[str, str]:
    """`a: b; c: d` -> {a: b, c: d}; unknown or repeated properties are errors."""
    out: dict[str, str] = {}
    for decl in style.split(";"):
        if not decl.strip():
            continue
        if ":" not in decl:
            raise PatchError(f"{where}: style declaration {decl.strip()!r} has no ':'")
        prop, _, value = decl.partition(":")
        prop = prop.strip().lower()
        if prop not in PROPERTIES:
            raise PatchError(f"{where}: unsupported style property {prop!r}; allowed: {list(PROPERTIES)}")
        if prop in out:
            raise PatchError(f"{where}: style property {prop!r} given twice")
        out[prop] = value.strip()
    return out


def box_from_style(style: dict[str, str], text: str, where: str) -> TextBox:
    missing = [p for p in REQUIRED if p not in style]
    if missing:
        raise PatchError(f"{where}: missing required style properties {missing}")
    if style.get("position", "absolute").lower() != "absolute":
        raise PatchError(f"{where}: 'position: {style['position']}' must be absolute")
    align = style.get("text-align", "left").lower()
    if align not in ALIGNS:
        raise PatchError(f"{where}: 'text-align: {align}' must be one of {list(ALIGNS)}")
    direction = style.get("direction", "ltr").lower()
    if direction not in DIRECTIONS:
        raise PatchError(f"{where}: 'direction: {direction}' must be one of {list(DIRECTIONS)}")
    if not text.strip():
        raise PatchError(f"{where}: the box has no text")
    if "\n" in text.strip():
        raise PatchError(f"{where}: a box holds one line of text; split lines into boxes")
    return TextBox(
        text=text.strip(),
        x=_px(style["left"], where, "left", False), y=_px(style["top"], where, "top", False),
        w=_px(style["width"], where, "width", True), h=_px(style["height"], where, "height", True),
        size=_px(style["font-size"], where, "font-size", True),
        font=_family(style.get("font-family", "DejaVu Sans"), where),
        weight=_weight(style.get("font-weight", "400"), where),
        color=parse_color(style.get("color", "#000000"), where),
        align=align, direction=direction)


def style_from_compact(attrs: dict[str, str | None], where: str) -> dict[str, str]:
    """The compact form's `<p>` attributes as the canonical style mapping (then validated as one)."""
    unknown = sorted(set(attrs) - set(COMPACT_KEYS))
    if unknown:
        raise PatchError(f"{where}: unsupported attribute(s) {unknown}; allowed: {list(COMPACT_KEYS)}")
    style: dict[str, str] = {}
    for key, prop in (("x", "left"), ("y", "top"), ("w", "width"), ("h", "height"), ("s", "font-size")):
        if key in attrs:
            style[prop] = attrs[key] or ""
    if "f" in attrs:
        code = (attrs["f"] or "").lower()
        if code not in COMPACT_FONTS:
            raise PatchError(f"{where}: 'f={attrs['f']}' must be one of {list(COMPACT_FONTS)}")
        style["font-family"] = COMPACT_FONTS[code]
    if "b" in attrs and "fw" in attrs:
        raise PatchError(f"{where}: give either 'b' (bold) or 'fw=N', not both")
    if "b" in attrs:
        style["font-weight"] = "700"
    elif "fw" in attrs:
        style["font-weight"] = attrs["fw"] or ""
    if "c" in attrs:
        style["color"] = "#" + (attrs["c"] or "").lstrip("#")
    if "a" in attrs:
        code = (attrs["a"] or "").lower()
        if code not in COMPACT_ALIGNS:
            raise PatchError(f"{where}: 'a={attrs['a']}' must be one of {list(COMPACT_ALIGNS)}")
        style["text-align"] = COMPACT_ALIGNS[code]
    if "rtl" in attrs:
        style["direction"] = "rtl"
    return style


# ----------------------------------------------------------------------------- parser

class _Parser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.root_style: dict[str, str] | None = None
        self.boxes: list[tuple[dict[str, str], list[str]]] = []
        self.open_box: tuple[dict[str, str], list[str]] | None = None
        self.stray: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        n = len(self.boxes) + 1
        if tag not in ("div", "p"):
            raise PatchError(f"box {n}: tag <{tag}> is not allowed; a patch holds only <div> "
                             "(or compact <p>) boxes")
        if self.open_box is not None:
            raise PatchError(f"box {len(self.boxes)}: nested tags inside a text box are not allowed")
        is_root = tag == "div" and "patch" in (attrs.get("class") or "").split()
        if tag == "p":
            if self.stack and self.root_style is None:
                raise PatchError(f"box {n}: boxes cannot nest")
            self.open_box = (style_from_compact(attrs, f"box {n}"), [])
        elif is_root:
            if self.stack or self.boxes or self.root_style is not None:
                raise PatchError("the <div class=\"patch\"> root must come first and only once")
            style = attrs.get("style") or ""
            self.root_style = {}
            for decl in style.split(";"):
                if decl.strip():
                    prop, _, value = decl.partition(":")
                    prop = prop.strip().lower()
                    if prop not in ("width", "height", "position"):
                        raise PatchError(f"patch root: unsupported style property {prop!r}; "
                                         "allowed: width, height")
                    self.root_style[prop] = value.strip()
        else:
            if self.stack and self.root_style is None:
                raise PatchError(f"box {n}: boxes cannot nest")
            self.open_box = (parse_style(attrs.get("style") or "", f"box {n}"), [])
        self.stack.append("root" if is_root else "box")

    def handle_endtag(self, tag):
        if not self.stack:
            raise PatchError(f"unexpected closing </{tag}> (after box {len(self.boxes)})")
        kind = self.stack.pop()
        if kind == "box":
            self.boxes.append(self.open_box)
            self.open_box = None

    def handle_data(self, data):
        if self.open_box is not None:
            self.open_box[1].append(data)
        elif data.strip():
            self.stray.append(data.strip())


def parse(text: str) -> Patch:
    """Parse and validate a patch; raises `PatchError` saying what is wrong and where."""
    if not isinstance(text, str) or not text.strip():
        raise PatchError("the patch is empty")
    parser = _Parser()
    parser.feed(text)
    parser.close()
    if parser.stack:
        raise PatchError(f"unclosed <div> (box {len(parser.boxes) + 1}): every box needs </div>")
    if parser.stray:
        raise PatchError(f"text outside any box: {parser.stray[0][:40]!r}")
    if not parser.boxes:
        raise PatchError("the patch has no text boxes")
    boxes = [box_from_style(style, "".join(chunks), f"box {i}")   # entities already decoded
             for i, (style, chunks) in enumerate(parser.boxes, start=1)]
    width = height = None
    if parser.root_style:
        if "width" in parser.root_style:
            width = int(round(_px(parser.root_style["width"], "patch root", "width", True)))
        if "height" in parser.root_style:
            height = int(round(_px(parser.root_style["height"], "patch root", "height", True)))
    return Patch(boxes, width, height)


def validate(patch: Patch, width: int, height: int, slack: float = 0.5) -> None:
    """Check every box lies within a `width`×`height` canvas (boxes may overhang by `slack`·size)."""
    for i, b in enumerate(patch.scaled(width, height).boxes, start=1):
        x0, y0, x1, y1 = b.rect()
        tol = slack * b.size
        if x0 < -tol or y0 < -tol or x1 > width + tol or y1 > height + tol:
            raise PatchError(f"box {i} ({x0:.0f},{y0:.0f})-({x1:.0f},{y1:.0f}) lies outside the "
                             f"{width}x{height} image")


# ----------------------------------------------------------------------------- writer

def _num(v: float) -> str:
    return str(int(round(v))) if abs(v - round(v)) < 1e-6 else f"{v:.1f}"


def color_hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def box_style(b: TextBox) -> str:
    """The canonical style string of one box (fixed property order, every property)."""
    return (f"left:{_num(b.x)}px;top:{_num(b.y)}px;width:{_num(b.w)}px;height:{_num(b.h)}px;"
            f"font-family:'{b.font}';font-size:{_num(b.size)}px;font-weight:{b.weight};"
            f"color:{color_hex(b.color)};text-align:{b.align};direction:{b.direction}")


_FONT_CODES = {family: code for code, family in COMPACT_FONTS.items()}


def to_compact(patch: Patch) -> str:
    """The compact form of a patch (defaults left out); `parse(to_compact(p)) == p` up to 0.1 px.
    The canvas size is not written: the boxes live in the image's own pixels."""
    out = []
    for b in patch.boxes:
        attrs = [f"x={_num(b.x)}", f"y={_num(b.y)}", f"w={_num(b.w)}", f"h={_num(b.h)}",
                 f"s={_num(b.size)}"]
        if b.font != "DejaVu Sans":
            attrs.append(f"f={_FONT_CODES[b.font]}")
        if b.weight == 700:
            attrs.append("b")
        elif b.weight != 400:
            attrs.append(f"fw={b.weight}")
        if b.color != (0, 0, 0):
            attrs.append("c=" + color_hex(b.color)[1:])
        if b.align != "left":
            attrs.append(f"a={b.align[0]}")
        if b.direction == "rtl":
            attrs.append("rtl")
        out.append(f'<p {" ".join(attrs)}>{html.escape(b.text, quote=False)}</p>')
    return "".join(out)


def to_html(patch: Patch, indent: bool = False) -> str:
    """The canonical HTML of a patch; `parse(to_html(p)) == p` (geometry rounded to 0.1 px)."""
    sep = "\n  " if indent else ""
    size = ""
    if patch.width and patch.height:
        size = f' style="width:{patch.width}px;height:{patch.height}px"'
    body = "".join(f'{sep}<div style="{box_style(b)}">{html.escape(b.text, quote=False)}</div>'
                   for b in patch.boxes)
    return f'<div class="patch"{size}>{body}{chr(10) if indent else ""}</div>'
