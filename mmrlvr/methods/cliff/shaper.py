"""Cliff — first-mistake token advantages.

Seed paper "Cliff" (docs/methods.md, further seeds: "Cliff first-mistake token advantages"): a
teacher finds the first wrong step of a rollout; the tokens before it are credited as good,
the tokens from it on carry the penalty. A wrong rollout stops punishing its sound opening.

For every rollout that is incorrect (score `correct_key` < `threshold`) with advantage A_i < 0,
the judge returns the character offset where its first wrong step starts; the offset maps to
token k (the first completion token whose decoded prefix passes the offset), and

    A_it ← before · |A_it|     t < k       (the sound prefix: +|A_i| by default)
    A_it ← after  · A_it       t >= k      (the mistake on: keeps A_i by default)

Correct rollouts, rollouts with A_i >= 0 and rollouts where the judge finds no mistake (or
fails) keep their advantages. Our choices, since the brief's statement of the paper fixes only
the signs: the prefix gets the same magnitude the rollout's penalty has (before 1.0), so the
rollout's credit is mirrored, not invented; the suffix keeps the plain GRPO penalty (after
1.0), so with the judge finding nothing the update is exactly GRPO's. The cliff token itself
(the one that starts the wrong step, its marker "Step 2:" included) is penalised.

Judges (`judge`):
    rule   StructReward's step alignment (`rewards.get("struct_steps").first_mistake`): the
           rollout's steps are aligned to the example's reference `steps`; the first step
           after the in-order matched prefix is the mistake. No reference steps: no cliff.
    http   an OpenAI-compatible chat endpoint (`url`, `model`) is shown the question, the
           reference steps and the numbered steps and asked for the number of the first wrong
           step (0: none). Each call has `timeout_s` (10 s); timeouts, HTTP errors and
           malformed replies are counted (`fail_<kind>`) and leave the rollout unshaped; after
           `max_failures` (3) failures in one step the judge is skipped for the rest of it
           (`judge_skipped`), so a dead endpoint costs at most 3·timeout_s a step. A bearer
           key, where needed, is read from the environment variable named `api_key_env`.
    model  a local HF model dir (`path`) prompted the same way, greedy decoding.

Logged: `judged` (incorrect rollouts with A_i < 0 sent to the judge), `found_frac` (of them,
the share with a cliff), `cliff_pos_mean` (cliff token / completion length), `shaped_abs_delta`
(mean |ΔA| over the shaped rollouts' tokens; `mean_abs_delta_adv` over all tokens is added by
`token_credit`). Config: `algo.shaping: [{name: cliff, judge: rule}]`.
"""
from __future__ import annotations

import re
from typing import Any

import torch

import rewards
from mmrlvr.algo.shaping import ShapeContext, TokenCredit
from mmrlvr.core.chat_client import ChatError, chat_completion, endpoint_of
from mmrlvr.core.types import Scores

JUDGES = ("rule", "http", "model")
PROMPT = """You check a student's solution step by step.

Question: {question}
Reference answer: {answer}
Reference steps:
{refs}

Student's steps:
{steps}

Reply with only the number of the student's first wrong step, or 0 if every step is right."""


class JudgeError(Exception):
    """A judge call that gave no verdict; `kind` is logged as `fail_<kind>`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def cliff_token(tokenizer: Any, ids: list[int], offset: int) -> int:
    """The first token whose decoded prefix passes character `offset` (len(ids) if none):
    tokens [0, k) lie wholly before the offset. Binary search over prefix decodes, decoded as
    the rollout engine decodes the texts (special tokens skipped)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid + 1], skip_special_tokens=True)) > offset:
            hi = mid
        else:
            lo = mid + 1
    return lo


def judge_prompt(example: Any, steps: list[str]) -> str:
    refs = "\n".join(f"- {s}" for s in (example.steps or [])) or "(none)"
    numbered = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1)) or "(no steps)"
    return PROMPT.format(question=example.prompt, answer=example.answer, refs=refs, steps=numbered)


def parse_step_number(reply: str, n_steps: int) -> int:
    """The step number a judge replied (0: no wrong step); JudgeError('malformed') otherwise."""
    found = re.search(r"-?\d+", reply or "")
    if found is None or not 0 <= int(found.group()) <= n_steps:
        raise JudgeError("malformed", f"expected a step number in 0..{n_steps}, got {reply!r}")
    return int(found.group())


class _StepJudge:
    """Shared by the teacher judges: number the steps, ask, map the number to an offset."""

    def __init__(self):
        self.steps = rewards.get("struct_steps")

    def first_mistake(self, example: Any, completion: str) -> int | None:
        steps, starts, _ = self.steps.located_steps(completion)
        if not steps:
            return None
        k = parse_step_number(self.ask(judge_prompt(example, steps)), len(steps))
        return starts[k - 1] if k else None

    def ask(self, prompt: str) -> str:
        raise NotImplementedError


class RuleJudge:
    def __init__(self):
        self.steps = rewards.get("struct_steps")

    def first_mistake(self, example: Any, completion: str) -> int | None:
        return self.steps.first_mistake(example, completion)


class HttpJudge(_StepJudge):
    def __init__(self, url: str, model: str, timeout_s: float = 10.0,
                 api_key_env: str | None = None):
        super().__init__()
        self.url = endpoint_of(url)
        self.model, self.timeout_s, self.api_key_env = model, float(timeout_s), api_key_env

    def ask(self, prompt: str) -> str:
        try:
            return chat_completion(self.url, [{"role": "user", "content": prompt}],
                                   model=self.model, timeout_s=self.timeout_s, max_tokens=16,
                                   api_key_env=self.api_key_env)
        except ChatError as e:
            raise JudgeError(e.kind, str(e)) from e


class ModelJudge(_StepJudge):
    def __init__(self, path: str, max_new_tokens: int = 8, device: str = "cpu"):
        super().__init__()
        self.path, self.max_new_tokens, self.device = path, int(max_new_tokens), device
        self.model = self.tokenizer = None

    def _load(self) -> None:
        import transformers as tf

        try:
            self.tokenizer = tf.AutoTokenizer.from_pretrained(self.path)
            try:
                self.model = tf.AutoModelForCausalLM.from_pretrained(self.path)
            except ValueError:              # a VLM dir: its text head answers text prompts
                self.model = tf.AutoModelForImageTextToText.from_pretrained(self.path)
        except OSError as e:
            raise ValueError(f"cliff: judge 'model' could not load algo.shaping[].path "
                             f"{self.path!r}: {e}") from e
        self.model.to(self.device).eval()

    def ask(self, prompt: str) -> str:
        if self.model is None:
            self._load()
        tok = self.tokenizer
        messages = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) \
            if tok.chat_template else prompt
        inputs = tok(text, return_tensors="pt").to(self.device)
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens,
                                      do_sample=False, pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


class Cliff:
    name = "cliff"
    stage = "advantage"

    def __init__(self, judge: str = "rule", before: float = 1.0, after: float = 1.0,
                 correct_key: str = "accuracy", threshold: float = 0.5, max_failures: int = 3,
                 url: str | None = None, model: str | None = None, timeout_s: float = 10.0,
                 api_key_env: str | None = None, path: str | None = None, max_new_tokens: int = 8):
        if judge not in JUDGES:
            raise ValueError(f"cliff: judge must be one of {list(JUDGES)}, got {judge!r}")
        if not (before >= 0 and after >= 0):
            raise ValueError(f"cliff: before and after must be >= 0, got {before}, {after}")
        if judge == "http" and not (url and model):
            raise ValueError("cliff: judge 'http' needs `url` (an OpenAI-compatible endpoint) and "
                             "`model` in its algo.shaping entry")
        if judge == "http" and not timeout_s > 0:
            raise ValueError(f"cliff: timeout_s must be > 0, got {timeout_s}")
        if judge == "model" and not path:
            raise ValueError("cliff: judge 'model' needs `path` (a local HF model dir) in its "
                             "algo.shaping entry")
        self.before, self.after = float(before), float(after)
        self.correct_key, self.threshold = correct_key, float(threshold)
        self.max_failures = int(max_failures)
        if judge == "rule":
            self.judge = RuleJudge()
        elif judge == "http":
            self.judge = HttpJudge(url, model, timeout_s, api_key_env)
        else:
            self.judge = ModelJudge(path, max_new_tokens)

    def _incorrect(self, scores: Scores) -> list[bool]:
        """[N], prompt-major: which completions the step's rewards count as wrong."""
        try:
            return (~scores.correct(self.correct_key, self.threshold, strict=True)).flatten().tolist()
        except KeyError as err:
            raise KeyError(f"cliff: correct_key {self.correct_key!r}: {err.args[0]}; set "
                           f"algo.shaping[].correct_key (e.g. 'accuracy' with an accuracy reward, or "
                           f"'struct_steps/acc')") from None

    def shape(self, credit: TokenCredit, ctx: ShapeContext) -> dict[str, float]:
        G, adv, mask = ctx.rollouts.group_size, credit.advantages, ctx.mask.bool()   # [N, C]
        judged, skipped, positions, shaped, fails = 0, 0, [], [], {}
        wrong = self._incorrect(ctx.scores)
        for r, text in enumerate(ctx.rollouts.texts):
            n = int(mask[r].sum())
            if not n or not wrong[r] or adv[r, :n].mean() >= 0:
                continue
            judged += 1
            if sum(fails.values()) >= self.max_failures:
                skipped += 1
                continue
            try:
                offset = self.judge.first_mistake(ctx.examples[r // G], text)
            except JudgeError as e:
                fails[e.kind] = fails.get(e.kind, 0) + 1
                continue
            if offset is None:
                continue
            ids = ctx.rollouts.completion_ids[r][mask[r]].tolist()
            k = cliff_token(ctx.policy.tokenizer, ids, offset)
            before = adv[r].clone()
            adv[r, :k] = self.before * adv[r, :k].abs()
            adv[r, k:n] = self.after * adv[r, k:n]
            positions.append(k / n)
            shaped.append((adv[r, :n] - before[:n]).abs().mean())
        stats = {"judged": float(judged),
                 "found_frac": len(positions) / judged if judged else 0.0,
                 "cliff_pos_mean": sum(positions) / len(positions) if positions else 0.0,
                 "shaped_abs_delta": float(torch.stack(shaped).mean()) if shaped else 0.0,
                 "judge_failures": float(sum(fails.values())), "judge_skipped": float(skipped)}
        stats.update({f"fail_{kind}": float(v) for kind, v in fails.items()})
        return stats
