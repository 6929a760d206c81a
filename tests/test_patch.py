"""The HTML patch schema: canonical round trip, and clear errors on malformed patches."""
from __future__ import annotations

import pytest

from mmrlvr.patches.schema import Patch, PatchError, TextBox, parse, to_html, validate

GOOD = ('<div class="patch" style="width:200px;height:100px">'
        '<div style="left:10px;top:5px;width:180px;height:30px;font-family:\'DejaVu Serif\';'
        'font-size:20px;font-weight:bold;color:#c00;text-align:center;direction:ltr">Neu &amp; frisch</div>'
        '<div style="position:absolute;left:10px;top:50px;width:90px;height:20px;font-size:12px">Jetzt</div>'
        '</div>')


def test_parse_reads_every_property_and_defaults_the_rest():
    p = parse(GOOD)
    assert (p.width, p.height) == (200, 100)
    a, b = p.boxes
    assert a == TextBox("Neu & frisch", 10, 5, 180, 30, 20, "DejaVu Serif", 700, (204, 0, 0),
                        "center", "ltr")
    assert b == TextBox("Jetzt", 10, 50, 90, 20, 12)          # DejaVu Sans, 400, black, left, ltr


def test_serialize_then_parse_is_the_identity():
    p = parse(GOOD)
    assert parse(to_html(p)) == p
    assert parse(to_html(p, indent=True)) == p
    assert to_html(parse(to_html(p))) == to_html(p)
    odd = Patch([TextBox("a < b > c", 1.5, 2, 30, 10, 8, color=(1, 2, 3))])
    assert parse(to_html(odd)) == odd


def test_bare_boxes_without_a_root_parse():
    p = parse('<div style="left:0;top:0;width:10px;height:10px;font-size:8px">x</div>')
    assert p.width is None and len(p.boxes) == 1


BOX = "left:1px;top:1px;width:50px;height:12px;font-size:10px"


@pytest.mark.parametrize("html, expected", [
    ("", "empty"),
    ('<div class="patch"></div>', "no text boxes"),
    (f'<div style="{BOX};margin:3px">x</div>', "box 1: unsupported style property 'margin'"),
    ('<div style="left:1px;top:1px;width:50px;font-size:10px">x</div>', "box 1: missing required style properties ['height']"),
    (f'<div style="{BOX};color:#12345">x</div>', "box 1: 'color: #12345'"),
    (f'<div style="{BOX};color:rgb(300,0,0)">x</div>', "0-255"),
    (f'<div style="{BOX};font-family:Comic Sans">x</div>', "is not available"),
    (f'<div style="{BOX};font-weight:heavy">x</div>', "font-weight"),
    (f'<div style="{BOX};text-align:justify">x</div>', "text-align"),
    (f'<div style="{BOX};direction:ttb">x</div>', "direction"),
    (f'<div style="{BOX};position:relative">x</div>', "must be absolute"),
    (f'<div style="{BOX};left:2px">x</div>', "given twice"),
    ('<div style="left:1px;top:1px;width:-5px;height:12px;font-size:10px">x</div>', "'width: -5px' must be > 0"),
    ('<div style="left:1em;top:1px;width:5px;height:12px;font-size:10px">x</div>', "number of px"),
    (f'<div style="{BOX}"></div>', "box 1: the box has no text"),
    (f'<div style="{BOX}">x</div><div style="{BOX}">a<b>b</b></div>', "tag <b> is not allowed"),
    (f'<div style="{BOX}">x<div style="{BOX}">y</div></div>', "nested"),
    (f'<span style="{BOX}">x</span>', "tag <span> is not allowed"),
    (f'<div style="{BOX}">x', "unclosed <div>"),
    (f'hello <div style="{BOX}">x</div>', "text outside any box"),
    (f'<div style="{BOX}">x</div></div>', "unexpected closing"),
    (f'<div style="{BOX}">x</div><div class="patch"><div style="{BOX}">y</div></div>', "root must come first"),
    (f'<div class="patch" style="width:10px;color:red"><div style="{BOX}">y</div></div>', "patch root"),
])
def test_malformed_patches_raise_errors_naming_the_problem(html, expected):
    with pytest.raises(PatchError) as err:
        parse(html)
    assert expected in str(err.value)


def test_validate_rejects_boxes_outside_the_canvas():
    p = parse(GOOD)
    validate(p, 200, 100)
    validate(p, 400, 200)                                     # the patch scales with the image
    far = Patch([TextBox("x", 150, 10, 100, 20, 10)], 200, 100)
    with pytest.raises(PatchError, match=r"box 1 .* outside the 200x100 image"):
        validate(far, 200, 100)


def test_scaling_maps_boxes_and_sizes_to_another_canvas():
    p = parse(GOOD).scaled(400, 50)
    a = p.boxes[0]
    assert (a.x, a.y, a.w, a.h, a.size) == (20, 2.5, 360, 15, 10)


# ----------------------------------------------------------------------------- compact form

def test_compact_form_means_the_same_boxes_as_the_canonical_html():
    from mmrlvr.patches.schema import to_compact

    p = parse(GOOD)
    compact = to_compact(p)
    assert compact == ('<p x=10 y=5 w=180 h=30 s=20 f=serif b c=cc0000 a=c>Neu &amp; frisch</p>'
                       '<p x=10 y=50 w=90 h=20 s=12>Jetzt</p>')
    assert parse(compact).boxes == p.boxes and parse(compact).width is None
    assert parse(to_html(parse(compact))).boxes == p.boxes          # what the browser gets
    odd = Patch([TextBox("a < b", 1.5, 2, 30, 10, 8, "Liberation Sans", 300, (1, 2, 3), "right", "rtl")])
    assert parse(to_compact(odd)) == odd
    assert len(compact) < len(to_html(p)) / 2


@pytest.mark.parametrize("text, expected", [
    ('<p x=1 y=1 w=50 h=12>x</p>', "missing required style properties ['font-size']"),
    ('<p x=1 y=1 w=50 h=12 s=10 q=3>x</p>', "box 1: unsupported attribute(s) ['q']"),
    ('<p x=1 y=1 w=50 h=12 s=10 f=comic>x</p>', "'f=comic' must be one of"),
    ('<p x=1 y=1 w=50 h=12 s=10 a=j>x</p>', "'a=j' must be one of"),
    ('<p x=1 y=1 w=50 h=12 s=10 b fw=300>x</p>', "either 'b'"),
    ('<p x=1 y=1 w=50 h=12 s=10 c=12345>x</p>', "'color: #12345'"),
    ('<p x=1 y=1 w=-5 h=12 s=10>x</p>', "'width: -5' must be > 0"),
    ('<p x=1 y=1 w=50 h=12 s=10>x<p x=1 y=1 w=5 h=1 s=1>y</p></p>', "nested"),
    ('<p x=1 y=1 w=50 h=12 s=10></p>', "box 1: the box has no text"),
])
def test_malformed_compact_boxes_raise_errors_naming_the_problem(text, expected):
    with pytest.raises(PatchError) as err:
        parse(text)
    assert expected in str(err.value)
