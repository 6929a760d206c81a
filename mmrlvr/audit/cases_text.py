"""Case generators, part 2: the wrappers every family's answers get, and the choice, yes/no and
free-text families.  Imported by ``mmrlvr.audit.cases.generate_cases``."""

from __future__ import annotations

import random

# ---------------------------------------------------------------------------
# generic rewrites (apply to any answer string)
# ---------------------------------------------------------------------------

GENERIC_REWRITES = {
    "identity": lambda s: s,
    "whitespace": lambda s: f"  {s} \t ",
    "trailing_period": lambda s: f"{s}.",
    "trailing_newline": lambda s: f"{s}\n",
    "dollar": lambda s: f"${s}$",
    "double_dollar": lambda s: f"$${s}$$",
    "latex_paren": lambda s: f"\\({s}\\)",
    "latex_bracket": lambda s: f"\\[{s}\\]",
    "boxed": lambda s: f"\\boxed{{{s}}}",
    "boxed_in_dollars_period": lambda s: f"$\\boxed{{{s}}}$.\n",
}
#: wrappers that only make sense around non-formula answers
TEXTISH_REWRITES = {
    "text_wrap": lambda s: f"\\text{{{s}}}",
    "markdown_bold": lambda s: f"**{s}**",
}


def rewrites(s: str, textish: bool = False):
    out = [(k, f(s)) for k, f in GENERIC_REWRITES.items()]
    if textish:
        out += [(k, f(s)) for k, f in TEXTISH_REWRITES.items()]
    return out


# ---------------------------------------------------------------------------
# multiple choice, yes/no, free text
# ---------------------------------------------------------------------------


def _words(s: str) -> list:
    return s.split()


_WORDS = _words(
    "mitochondria chloroplast ribosome nucleus vacuole osmosis diffusion photosynthesis "
    "respiration fermentation glucose protein enzyme hormone neuron synapse gravity friction "
    "momentum inertia velocity acceleration voltage current resistance magnetism refraction "
    "reflection absorption granite basalt limestone marble Paris London Berlin Madrid Rome "
    "Vienna Lisbon Dublin Oslo Athens Warsaw Prague"
)


def _choice_item(rng: random.Random, i: int):
    n = 4 + i % 3
    texts = rng.sample(_WORDS, n)
    if i % 2:
        texts = [f"{t} {rng.choice(('layer', 'cell', 'field', 'city'))}" for t in texts]
    idx = rng.randrange(n)
    gl = chr(65 + idx)
    other = (idx + 1 + rng.randrange(n - 1)) % n
    ol = chr(65 + other)
    gold = gl
    text, otext = texts[idx], texts[other]
    with_choices = i % 3 != 0
    choices = tuple(texts) if with_choices else None
    rw = rewrites(gl, textish=True) + [
        ("paren", f"({gl})"),
        ("period", f"{gl}."),
        ("rparen", f"{gl})"),
        ("option", f"Option {gl}"),
        ("option_lower", f"option {gl.lower()}"),
        ("markdown_bold_paren", f"**({gl})**"),
        ("lowercase", gl.lower()),
        ("letter_colon_text", f"{gl}: {text}"),
        ("paren_letter_text", f"({gl}) {text}"),
        ("boxed_paren", f"\\boxed{{({gl})}}"),
    ]
    near = [
        ("other_letter", ol),
        ("other_paren", f"({ol})"),
        ("other_period", f"{ol}."),
        ("other_option", f"Option {ol}"),
        ("other_lowercase", ol.lower()),
        ("other_bold", f"**{ol}**"),
        ("other_colon_text", f"{ol}: {otext}"),
        ("two_letters", f"{gl} or {ol}"),
        ("letter_list", f"{gl}, {ol}"),
    ]
    if with_choices:
        rw += [
            ("option_text", text),
            ("option_text_upper", text.upper()),
            ("option_text_period", f"{text}."),
            ("option_text_the", f"the {text}"),
        ]
        near += [
            ("other_option_text", otext),
            ("letter_with_other_text", f"{gl}: {otext}"),
        ]
    return gold, choices, rw, near


def _yesno_item(rng: random.Random, i: int):
    yes = i % 2 == 0
    w, o = ("yes", "no") if yes else ("no", "yes")
    gold = (w, w.capitalize(), w.upper())[i % 3]
    rw = rewrites(gold, textish=True) + [
        ("lower", w),
        ("upper", w.upper()),
        ("title", w.capitalize()),
        ("exclamation", w.capitalize() + "!"),
        ("bold_period", f"**{w.capitalize()}.**"),
        ("quoted", f'"{w}"'),
    ]
    near = [
        ("opposite", o),
        ("opposite_title", o.capitalize()),
        ("opposite_period", o + "."),
        ("opposite_boxed", f"\\boxed{{{o}}}"),
        ("opposite_bold", f"**{o.upper()}**"),
        ("maybe", "maybe"),
        ("both", f"{w} or {o}"),
    ]
    return gold, None, rw, near


_PHRASES = (
    "Eiffel Tower",
    "Marie Curie",
    "photosynthesis",
    "Pacific Ocean",
    "Leonardo da Vinci",
    "carbon dioxide",
    "Isaac Newton",
    "Great Wall of China",
    "mitochondria",
    "Mount Everest",
    "Albert Einstein",
    "Amazon River",
    "blue whale",
    "Charles Darwin",
    "New York City",
    "Roman Empire",
    "water vapor",
    "South Africa",
    "red blood cells",
    "Jupiter",
    "Thomas Edison",
    "Sahara Desert",
    "Mona Lisa",
    "Ada Lovelace",
    "ozone layer",
)


def _text_item(rng: random.Random, i: int):
    p = _PHRASES[i % len(_PHRASES)]
    article = i % 2 == 0 and p[0].isupper() and " " in p
    gold = f"the {p}" if article else p
    words = p.split()
    rw = rewrites(gold, textish=True) + [
        ("lower", gold.lower()),
        ("upper", gold.upper()),
        ("title", gold.title()),
        ("article_toggled", p if article else f"the {p}"),
        ("article_a", f"a {p}"),
        ("exclamation", gold + "!"),
        ("inner_double_space", gold.replace(" ", "  ")),
        ("quoted", f'"{gold}"'),
        ("trailing_comma", gold + ","),
    ]
    near = [
        ("other_phrase", _PHRASES[(i + 1 + rng.randrange(len(_PHRASES) - 1)) % len(_PHRASES)]),
        ("superstring", f"{gold} museum"),
        ("typo", gold[:-1] + ("x" if gold[-1] != "x" else "y")),
        ("plural", gold + "s"),
        ("negated", f"not {gold}"),
    ]
    if len(words) > 1:
        near.append(("prefix_substring", words[0]))
        near.append(("suffix_substring", words[-1]))
    else:
        near.append(("prefix_substring", p[: max(3, len(p) // 2)]))
    return gold, None, rw, near


GENERATORS = {"choice": _choice_item, "yesno": _yesno_item, "text": _text_item}
