"""StructReward: dense process credit from step-labelled reference solutions (docs/methods.md).

No learned process reward model and no LLM judge: the completion's reasoning (its `<think>`
part) is split into steps, and the steps are aligned to the example's reference `steps` with an
order-preserving one-to-one alignment (dynamic programming, most matched pairs). A step matches
a reference step by the first of these that fires:

    numeric   the reference step is a computation (numbers and operators, at most two words:
              `2 + 1 = 3`, `area = 12`) whose numbers appear in order among the step's, and both
              end on the same value: two integers must be equal exactly (10001 is not 10000),
              a relative tolerance of 1e-4 applies only when one of them is not an integer
              (a rounded decimal: 0.3333 for 1/3);
    symbolic  both steps carry a formula and `rewards.verify.match` proves it equivalent (for
              equations: first sides and last sides). Never for bare numbers — an identity like
              `1 + 1 = 2` is "equal" to any other true numeric identity, which is numeric's job;
    lexical   token F1 >= 0.5 over SQuAD-normalised tokens (lower case, no punctuation, no
              articles) between a step and a prose reference step — unless both state numbers
              and the numbers differ ("the total is 4" is not "the total is 5", whatever the
              overlap). A reference formula is never matched lexically.

    r_proc = matched reference steps / reference steps
    hard gate (default):  R = valid · (acc + λ·acc·r_proc)      λ = 0.5
    soft gate (option):   R = acc + λ·r_proc                    0 <= λ < 1

`acc` is the `accuracy` reward's verdict (`rewards.verify` on the extracted answer). `valid` is
our reading of "well formatted": `rewards.format.is_well_formatted` — one non-empty `<think>`
block then one non-empty `<answer>` block (or a final `\\boxed{}`), nothing after it. Under
either gate a wrong answer never scores above a correct one: the hard gate gives a wrong answer
0, the soft gate at most λ < 1 against at least 1. The soft gate leaves `valid` out, as
docs/methods.md writes it: multiplying it in would let a tidy wrong answer outscore an untidy
correct one.

When an example has no reference `steps`, r_proc = 0 and R reduces to valid·acc (soft: acc).

Segmentation: explicit markers win — "Step k:" (inline or at a line start), numbered items
(`1.`, `2)`) and bullets each open a step, and unmarked lines continue the open step. Text
without markers is split on newlines and then on sentence ends (a one-liner "I see 2 red
circles. 2 + 1 = 3." is two steps). Fragments of fewer than two tokens ("So.", "3") join the
step before them. At most `MAX_STEPS` steps are aligned.

Logged per completion: `overall`, `acc`, `valid`, `r_proc`, `matched` (reference steps
matched), `steps` (steps found) and which matcher fired (`m_numeric`, `m_symbolic`,
`m_lexical`, summing to `matched`).
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable

from mmrlvr.data import Example
from rewards.format import is_well_formatted
from rewards.verify import detect_kind, extract_answer, match

REL_TOL = 1e-4
"""Numeric matcher: relative tolerance between two numbers when one is not an integer
(docs/methods.md); integers compare exactly."""
F1_MIN = 0.5
"""Lexical matcher: least token F1 (docs/methods.md)."""
NUMERIC_MAX_WORDS = 2
"""A reference step is a computation (numeric matcher applies) with at most this many words."""
MAX_STEPS = 64
"""Steps of one completion that are aligned; the rest are ignored (bounds the DP's cost)."""
MATCHERS = ("numeric", "symbolic", "lexical")

# ----------------------------------------------------------------------------- segmentation

_THINK_RE = re.compile(r"<think>(.*?)(?:</think>|<answer>|\Z)", re.DOTALL)
_ANSWER_OPEN_RE = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_INLINE_STEP_RE = re.compile(r"(?<!^)(?<![\n*])[ \t]*((?:\*\*)?\bstep\s*\d+\s*(?:\*\*)?[:.)])",
                             re.IGNORECASE)
_MARKER_RE = re.compile(                       # "Step k:", "1." / "2)", bullets; markdown bold
    r"^\s*(?:#+\s*)?(?:\*\*)?"
    r"(?:step\s*\d+\s*(?:\*\*)?[:.)\-]?|\(?\d{1,2}[.)](?!\d)|[-*\u2022](?=\s))"
    r"(?:\*\*)?\s*", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\\$(\[])")
_TOKEN_RE = re.compile(r"[A-Za-z]+|\d+(?:\.\d+)?")


def reasoning_of(text: str) -> str:
    """The reasoning of a completion: its `<think>` part (to `</think>`, `<answer>` or the end);
    without a `<think>` tag, the text before the first `<answer>`."""
    m = _THINK_RE.search(text)
    if m:
        return m.group(1)
    return _ANSWER_OPEN_RE.split(text, maxsplit=1)[0]


def reasoning_span(text: str) -> tuple[int, int]:
    """Where `reasoning_of(text)` lies in `text`: (start, end) character offsets."""
    m = _THINK_RE.search(text)
    if m:
        return m.start(1), m.end(1)
    answer = _ANSWER_OPEN_RE.search(text)
    return 0, answer.start() if answer else len(text)


def _tokens(s: str) -> list[str]:
    return _TOKEN_RE.findall(s)


def _merge_tiny(pieces: list[str]) -> list[str]:
    """Join fragments of fewer than two tokens to the step before (the first: to the next)."""
    out: list[str] = []
    carry = ""
    for piece in pieces:
        if len(_tokens(piece)) < 2:
            if out:
                out[-1] = f"{out[-1]} {piece}"
            else:
                carry = f"{carry} {piece}".strip()
            continue
        out.append(f"{carry} {piece}".strip() if carry else piece)
        carry = ""
    if carry:
        out.append(carry)   # the whole reasoning is one tiny fragment: still one step
    return out


def split_steps(reasoning: str) -> list[str]:
    """Steps of a reasoning text (see the module doc for the rules)."""
    text = _INLINE_STEP_RE.sub(r"\n\1", reasoning.strip())
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if any(_MARKER_RE.match(ln) for ln in lines):
        pieces: list[str] = []
        for ln in lines:
            marked = _MARKER_RE.match(ln)
            body = ln[marked.end():].strip() if marked else ln.strip()
            if marked or not pieces:
                pieces.append(body)
            else:
                pieces[-1] = f"{pieces[-1]} {body}".strip()
    else:
        pieces = [s for ln in lines for s in _SENTENCE_END_RE.split(ln.strip())]
    return _merge_tiny([p.strip() for p in pieces if p.strip()])


def reference_steps(steps: list[str] | None) -> list[str]:
    """Reference steps as given (one per item), markers stripped, empty items dropped."""
    out = []
    for s in steps or []:
        marked = _MARKER_RE.match(s)
        body = (s[marked.end():] if marked else s).strip()
        if body:
            out.append(body)
    return out


# ----------------------------------------------------------------------------- numbers

_NUMBER_RE = re.compile(
    r"\\[dt]?frac\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}"     # \frac{a}{b}
    r"|(?<![A-Za-z_\d.])(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?)"  # 1,234.5e3
    r"(?:\s*/\s*(\d+(?:\.\d+)?)(?![\d.]))?")                                        # a/b


@functools.lru_cache(maxsize=65536)
def numbers(text: str) -> tuple[float, ...]:
    """Numbers in a step, in order: integers, decimals, `1,234`, `1e-3`, `a/b`, `\\frac{a}{b}`."""
    out = []
    for m in _NUMBER_RE.finditer(text):
        if m.group(1) is not None:
            num, den = float(m.group(1)), float(m.group(2))
        else:
            num = float(m.group(3).replace(",", ""))
            den = float(m.group(4)) if m.group(4) else 1.0
        if den != 0 and math.isfinite(num):
            out.append(num / den)
    return tuple(out)


def _close(a: float, b: float) -> bool:
    """Equal numbers: integers exactly (a relative tolerance at 10⁴ would take 10001 for 10000,
    the verifier false positive of docs/structreward.md), others within `REL_TOL`."""
    if a.is_integer() and b.is_integer():
        return a == b
    return math.isclose(a, b, rel_tol=REL_TOL)


def _same_numbers(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Equal as multisets, within the tolerance."""
    if len(a) != len(b):
        return False
    return all(_close(x, y) for x, y in zip(sorted(a), sorted(b)))


_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_LATEX_CMD_RE = re.compile(r"\\[A-Za-z]+")


_ASSIGN_RE = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*=")
_VARIABLE_RE = re.compile(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])")


def _is_computation(step: str) -> bool:
    """Numbers and operators, at most NUMERIC_MAX_WORDS words, no variable but an assigned one
    (`x = 3`). Formulas in variables are left to `symbolic`: numbers alone do not tell
    `(x-1)(x+1)` from `(x-1)(x-1)`."""
    rest = _ASSIGN_RE.sub(" ", _LATEX_CMD_RE.sub(" ", step))
    return (bool(numbers(step)) and len(_WORD_RE.findall(rest)) <= NUMERIC_MAX_WORDS
            and not _VARIABLE_RE.search(rest))


def match_numeric(step: str, ref: str) -> bool:
    """The reference is a computation whose numbers appear in order in `step`, same final value."""
    if not _is_computation(ref):
        return False
    got, want = numbers(step), numbers(ref)
    if not got or not _close(got[-1], want[-1]):
        return False
    i = 0
    for x in got:                      # `want` is a subsequence of `got`
        if i < len(want) and _close(x, want[i]):
            i += 1
    return i == len(want)


# ----------------------------------------------------------------------------- symbolic

_DOLLAR_RE = re.compile(r"\$\$?([^$]+?)\$\$?|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_EQ_SPLIT_RE = re.compile(r"(?<![<>!\\])=(?!=)")
_MATHY_RE = re.compile(r"[\d=+\-*/^\\]")


def _is_math(s: str) -> bool:
    try:
        return detect_kind(s) in ("number", "expression")
    except ValueError:
        return False


@functools.lru_cache(maxsize=65536)
def math_span(step: str) -> str | None:
    """The formula a step states: its last `$…$` / `\\(…\\)` segment, else its longest word
    suffix that reads as math (`So 2x + 1 = 7.` -> `2x + 1 = 7.`); None for prose."""
    found = _DOLLAR_RE.findall(step)
    if found:
        span = next(g for g in found[-1] if g).strip()
        return span if span and _is_math(span) else None
    words = step.split()
    for i in range(len(words)):
        span = " ".join(words[i:])
        if _MATHY_RE.search(span) and _is_math(span):
            return span
    return None


def _sides(span: str) -> list[str]:
    return [s.strip() for s in _EQ_SPLIT_RE.split(span)]


def match_symbolic(step: str, ref: str) -> bool:
    """Both steps state formulas that `rewards.verify.match` proves equivalent."""
    want = math_span(ref)
    if want is None or detect_kind(want) != "expression" or not re.search(r"[A-Za-z\\=]", want):
        return False                   # bare numbers and numeric-only forms: numeric's job
    got = math_span(step)
    if got is None:
        return False
    ref_sides, got_sides = _sides(want), _sides(got)
    if any(not s for s in ref_sides + got_sides):
        return False
    if len(ref_sides) == 1:
        return match(got_sides[-1], want)
    if len(got_sides) == 1:
        return False                   # the reference derives an equation; a value is not it
    return match(got_sides[0], ref_sides[0]) and match(got_sides[-1], ref_sides[-1])


# ----------------------------------------------------------------------------- lexical

_PUNCT_RE = re.compile(r"[^\w\s.]|(?<!\d)\.|\.(?!\d)|_")
_ARTICLES = frozenset(("a", "an", "the"))


def _norm_tokens(s: str) -> list[str]:
    words = _PUNCT_RE.sub(" ", s.casefold()).split()
    return [w for w in words if w not in _ARTICLES]


def token_f1(a: str, b: str) -> float:
    """SQuAD-style token F1 between two texts (bag of normalised tokens)."""
    ta, tb = _norm_tokens(a), _norm_tokens(b)
    common = sum((Counter(ta) & Counter(tb)).values())
    if not common:
        return 0.0
    precision, recall = common / len(ta), common / len(tb)
    return 2 * precision * recall / (precision + recall)


def match_lexical(step: str, ref: str) -> bool:
    """Token F1 >= F1_MIN between prose steps that state the same numbers (if any).

    A reference step that is a formula is left to `numeric` and `symbolic`: its tokens lose the
    operators, so `(x-1)(x-1)` would overlap `(x-1)(x+1)` completely."""
    if _is_math(ref):
        return False
    got, want = numbers(step), numbers(ref)
    if got and want and not _same_numbers(got, want):
        return False
    return token_f1(step, ref) >= F1_MIN


# ----------------------------------------------------------------------------- alignment

@functools.lru_cache(maxsize=65536)
def match_step(step: str, ref: str) -> str | None:
    """The first matcher that pairs `step` with reference step `ref` (numeric, symbolic,
    lexical), or None."""
    if match_numeric(step, ref):
        return "numeric"
    if match_symbolic(step, ref):
        return "symbolic"
    if match_lexical(step, ref):
        return "lexical"
    return None


def align(steps: list[str], refs: list[str],
          matcher: Callable[[str, str], str | None] = match_step) -> list[tuple[int, int, str]]:
    """Most (step, reference) pairs that match, in order on both sides, each used at most once.

    Longest-common-subsequence DP over the match matrix; returns (step index, reference index,
    matcher) with both indices strictly increasing.
    """
    n, m = len(steps), len(refs)
    how = [[matcher(s, r) for r in refs] for s in steps]                     # [n][m]
    best = [[0] * (m + 1) for _ in range(n + 1)]                             # [n+1][m+1]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            best[i][j] = max(best[i - 1][j], best[i][j - 1],
                             best[i - 1][j - 1] + 1 if how[i - 1][j - 1] else 0)
    pairs = []
    i, j = n, m
    while i and j:
        if how[i - 1][j - 1] and best[i][j] == best[i - 1][j - 1] + 1:
            pairs.append((i - 1, j - 1, how[i - 1][j - 1]))
            i, j = i - 1, j - 1
        elif best[i - 1][j] >= best[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


# ----------------------------------------------------------------------------- the reward

class StructStepsReward:
    """StructReward (see the module doc). Options: `lam` (λ, 0.5), `gate` (`hard` | `soft`),
    `allow_boxed` (a final `\\boxed{}` counts as the answer block for `valid`, as `format`)."""

    def __init__(self, lam: float = 0.5, gate: str = "hard", allow_boxed: bool = True):
        if gate not in ("hard", "soft"):
            raise ValueError(f"struct_steps: gate must be 'hard' or 'soft', got {gate!r}")
        if lam < 0 or (gate == "soft" and lam >= 1):
            raise ValueError(f"struct_steps: lam must be >= 0 (and < 1 with gate 'soft', so a "
                             f"wrong answer never outscores a correct one), got {lam}")
        self.name = "struct_steps"
        self.lam, self.gate, self.allow_boxed = float(lam), gate, allow_boxed

    def score_one(self, example: Example, text: str, refs: list[str]) -> dict[str, float]:
        answer = extract_answer(text)
        acc = float(answer is not None and match(answer, example.answer, example.choices))
        valid = float(is_well_formatted(text, self.allow_boxed))
        steps = split_steps(reasoning_of(text))[:MAX_STEPS]
        pairs = align(steps, refs) if refs else []
        r_proc = len(pairs) / len(refs) if refs else 0.0
        if self.gate == "hard":
            overall = valid * (acc + self.lam * acc * r_proc)
        else:
            overall = acc + self.lam * r_proc
        fired = Counter(how for _, _, how in pairs)
        return {"overall": overall, "acc": acc, "valid": valid, "r_proc": r_proc,
                "matched": float(len(pairs)), "steps": float(len(steps)),
                **{f"m_{name}": float(fired[name]) for name in MATCHERS}}

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        refs = reference_steps(example.steps)
        return [self.score_one(example, text, refs) for text in completions]

    def located_steps(self, completion: str) -> tuple[list[str], list[int], int]:
        """The steps `score` aligns, where each starts in `completion`, and where the reasoning
        after the last one resumes (all character offsets into `completion`).

        A step starts at the first non-space character after the step before it, so its marker
        ("Step 2:") is part of it. Steps are found word by word in order: segmentation only
        drops markers and whitespace, so every word of a step is in the text, in order."""
        start, end = reasoning_span(completion)
        steps = split_steps(completion[start:end])[:MAX_STEPS]
        cursor, starts = start, []
        for step in steps:
            starts.append(_skip_space(completion, cursor, end))
            for word in step.split():
                found = completion.find(word, cursor, end)
                if found >= 0:
                    cursor = found + len(word)
        return steps, starts, _skip_space(completion, cursor, end)

    def first_mistake(self, example: Example, completion: str) -> int | None:
        """Character offset in `completion` where its first wrong step starts, or None when
        every reference step is matched in order (or the example has no reference `steps`).

        With `score`'s alignment, k = how many reference steps (from the first) are matched in
        order; the first mistake is the step after the one matching reference k (the first
        step if k = 0): steps the references lack are tolerated while the next reference step
        still follows. A reasoning that stops early errs where it stops."""
        refs = reference_steps(example.steps)
        if not refs:
            return None
        steps, starts, tail = self.located_steps(completion)
        pairs = align(steps, refs)
        k = 0
        while k < len(pairs) and pairs[k][1] == k:
            k += 1
        if k == len(refs):
            return None
        first = pairs[k - 1][0] + 1 if k else 0
        return starts[first] if first < len(steps) else tail


def _skip_space(text: str, i: int, end: int) -> int:
    while i < end and text[i].isspace():
        i += 1
    return i
