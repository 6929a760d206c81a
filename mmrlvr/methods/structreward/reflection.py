"""StructReward's reflection rewrite: correct trajectories rewritten into reflection instances
(a wrong step, its detection, the fix), trained with an SFT loss beside GRPO every K steps.

Objective `{name: reflection, weight: 0.1, every: 4, rewriter: policy, max_instances: 4}`. On a
step that is a multiple of `every` it takes up to `max_instances` correct rollouts (one per
group, groups in order; correct by the step's `Scores.correct`), asks the rewriter to rewrite
each (`PROMPT`: the question, the solution, and the instruction to put one plausible wrong step
in, notice it, fix it and finish with the same answer), decoding greedily up to
`max_new_tokens`, and keeps a rewrite only when it
  * states the gold answer (`rewards.verify` on its extracted answer),
  * says that it caught something (one of `REFLECTION_WORDS`, case-insensitive),
  * differs from the original and is at most `MAX_GROWTH` times its length.
Anything else fails closed and is counted (`malformed`); nothing is trained from it. The kept
rewrites are the targets of a token-mean NLL after the source prompt (its images included),

    L = − Σ_it m_it · log π(y_it | prompt_i, y_i<t) / Σ_it m_it

computed every epoch of that step; other steps add nothing. `rewriter: policy` is the policy
being trained (its weights at that step, no copy); a model dir is loaded once, frozen, with the
policy's modality adapter, on the policy's device. Every rewrite is appended to
`RUN_DIR/reflections.jsonl` (step, example id, source row, kept or why not, the texts).

Our reading of the paper: it uses a strong LLM as the rewriter and trains the whole rewritten
trajectory; here any local model or the policy is the rewriter, the whole rewrite is the target
(the wrong step included: it is followed by its detection and fix), and an API rewriter is not
wired yet.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from mmrlvr.core.types import select
from mmrlvr.data import Example

PROMPT = ("Question: {question}\n\nA correct solution:\n{solution}\n\nRewrite this solution as a "
          "reflection: make one step contain a plausible mistake, then notice it (\"Wait, that "
          "is wrong\"), fix it, and continue to the same final answer, written as <answer>{answer}"
          "</answer>.")
REFLECTION_WORDS = ("wait", "mistake", "wrong", "error", "let me check", "actually", "correction")
MAX_GROWTH = 4.0
"""A rewrite longer than this many times its source is refused (a rewriter that rambles)."""


def verdict(rewrite: str, source: str, example: Example) -> str:
    """'kept', or why the rewrite fails closed."""
    from rewards.verify import extract_answer, match

    answer = extract_answer(rewrite)
    if answer is None or not match(answer, example.answer, example.choices):
        return "answer"
    if not any(w in rewrite.casefold() for w in REFLECTION_WORDS):
        return "no_reflection"
    if rewrite.strip() == source.strip():
        return "unchanged"
    if len(rewrite) > MAX_GROWTH * max(len(source), 1):
        return "too_long"
    return "kept"


class Reflection:
    """The reflection-rewrite stage (see the module doc)."""

    name = "reflection"

    def __init__(self, every: int = 4, rewriter: str = "policy", max_instances: int = 4,
                 max_new_tokens: int = 256, correct_key: str = "accuracy", threshold: float = 0.5):
        if every < 1 or max_instances < 1 or max_new_tokens < 1:
            raise ValueError(f"reflection: every, max_instances and max_new_tokens must be >= 1, "
                             f"got {every}, {max_instances}, {max_new_tokens}")
        self.every, self.rewriter_path, self.max_instances = int(every), str(rewriter), int(max_instances)
        self.max_new_tokens, self.correct_key, self.threshold = int(max_new_tokens), correct_key, threshold
        self._rewriter = None
        self._step: int | None = None
        self._kept: list[tuple[int, str]] = []       # (group, rewrite)
        self._stats: dict[str, float] = {}

    def rewriter(self, policy):
        if self.rewriter_path == "policy":
            return policy
        if self._rewriter is None:
            from mmrlvr.config import ModelConfig
            from mmrlvr.train.policy import Policy

            if not Path(self.rewriter_path, "config.json").is_file():
                raise FileNotFoundError(f"reflection: rewriter {self.rewriter_path!r} is neither "
                                        "'policy' nor a model dir with a config.json")
            self._rewriter = Policy.load(ModelConfig(path=self.rewriter_path), policy.adapter,
                                         policy.device)
            for p in self._rewriter.model.parameters():
                p.requires_grad_(False)
        return self._rewriter

    def rewrite(self, policy, examples: list[Example], sources: list[str]) -> list[str]:
        """The rewriter's greedy rewrites of `sources` (one per example)."""
        from mmrlvr.rollout import SamplingParams
        from mmrlvr.rollout.hf import HFRolloutEngine

        model = self.rewriter(policy)
        asks = [Example(id=f"{ex.id}#reflect", prompt=PROMPT.format(question=ex.prompt, solution=src,
                                                                    answer=ex.answer),
                        answer=ex.answer, images=list(ex.images), audios=list(ex.audios))
                for ex, src in zip(examples, sources)]
        prompts = model.adapter.encode(asks, model.processor)
        out = HFRolloutEngine(model).generate(prompts, SamplingParams(
            n=1, max_new_tokens=self.max_new_tokens, greedy=True))
        return out.texts

    def loss(self, ctx) -> tuple[torch.Tensor | None, dict[str, float]]:
        if ctx.step % self.every:
            return None, {}
        if self._step != ctx.step:
            self._step = ctx.step
            self._build(ctx)
        if not self._kept:
            return None, dict(self._stats)
        policy, rollouts = ctx.policy, ctx.rollouts
        targets = [policy.tokenizer(text, add_special_tokens=False)["input_ids"] + policy.eos_ids[:1]
                   for _, text in self._kept]
        width = max(len(t) for t in targets)
        ids = torch.full((len(targets), width), policy.pad_id, dtype=torch.long)     # [K, C]
        mask = torch.zeros((len(targets), width), dtype=torch.long)                  # [K, C]
        for i, t in enumerate(targets):
            ids[i, :len(t)], mask[i, :len(t)] = torch.tensor(t), 1
        inputs, _ = select(rollouts.prompts, [g for g, _ in self._kept])              # [K, P]
        logp, _ = policy.completion_logprobs(inputs, ids, mask)                       # [K, C]
        m = mask.to(logp.device, logp.dtype)
        return -(logp * m).sum() / m.sum(), {**self._stats, "tokens": float(m.sum())}

    def _build(self, ctx) -> None:
        rollouts, G = ctx.rollouts, ctx.rollouts.group_size
        correct = ctx.scores.correct(self.correct_key, self.threshold)                # [B, G]
        rows = []
        for b in range(correct.shape[0]):
            ok = [b * G + g for g in range(G) if correct[b, g] and rollouts.texts[b * G + g].strip()]
            if ok:
                rows.append(ok[0])
        rows = rows[:self.max_instances]
        examples = [rollouts.prompts.examples[r // G] for r in rows]
        sources = [rollouts.texts[r] for r in rows]
        rewrites = self.rewrite(ctx.policy, examples, sources) if rows else []
        verdicts = [verdict(w, s, ex) for w, s, ex in zip(rewrites, sources, examples)]
        self._kept = [(r // G, w) for r, w, v in zip(rows, rewrites, verdicts) if v == "kept"]
        self._stats = {"rewritten": float(len(rows)), "kept": float(len(self._kept)),
                       "malformed": float(len(rows) - len(self._kept))}
        if ctx.run_dir is not None and rows:
            with (Path(ctx.run_dir) / "reflections.jsonl").open("a", encoding="utf-8") as fh:
                for r, ex, s, w, v in zip(rows, examples, sources, rewrites, verdicts):
                    fh.write(json.dumps({"step": ctx.step, "example_id": ex.id, "row": r,
                                         "verdict": v, "source": s, "rewrite": w},
                                        ensure_ascii=False) + "\n")
