"""Recycled rollouts as tasks the policy must solve (StructReward recycling, `form: tasks`).

After scoring, every group that holds a correct and a wrong rollout of one prompt yields:

  * a comparison task: the question (with its images), the two attempts shown as A and B in an
    order drawn per (step, group), and "which attempt reaches the right answer? A or B". Its gold
    is the correct attempt's letter (`choices` [A, B]), so it is verifiable;
  * a self-correction task: the question, the wrong attempt, and "it contains an error: find it,
    fix it, give the corrected final answer". Its gold is the question's own answer.

Each task is sampled `group` times by the policy (the HF engine, no branching, at the options'
`temperature` and `max_new_tokens`), every sample is scored by `rewards.verify.match` on its
extracted answer (1 or 0), advantages are taken over each task's samples as GRPO takes them
(mean/std within the group), and the objective's loss is the clipped surrogate over the samples'
tokens, token mean:

    L = − Σ_it m_it · min(ρ_it·A_i, clip(ρ_it, 1 ± ε)·A_i) / Σ_it m_it,   ρ = π/π_old,  ε 0.2

with π_old the policy when the tasks were sampled (the step's first call; ρ = 1 there, so the
first epoch is the plain policy gradient A·∇log π). Tasks whose samples all score alike give no
gradient (as in GRPO). Sampling and scoring happen once per step; later PPO epochs reuse them.
Single process only (the extra generate is not spread over ranks yet).

Our reading of the paper's "response comparison" and "self-correction" instances: tasks trained
by reinforcement with a verifiable reward, beside the step's GRPO loss.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from mmrlvr.core.types import Scores
from mmrlvr.data import Example

COMPARE = ("{question}\n\nTwo attempts at this question follow.\n\nAttempt A:\n{a}\n\n"
           "Attempt B:\n{b}\n\nExactly one of them reaches the right answer. Which one? End with "
           "the letter of the right attempt in <answer></answer>.")
FIX = ("{question}\n\nAn attempt at this question follows. It contains an error.\n\nAttempt:\n"
       "{wrong}\n\nFind the error, fix it, and end with the corrected final answer in "
       "<answer></answer>.")
CLIP = 0.2
"""ε of the tasks' clipped surrogate (GRPO's usual value)."""


@dataclass
class Task:
    kind: str              # "compare" or "fix"
    group: int             # the source prompt's index in the step's batch
    example: Example       # the task itself: prompt, images, gold answer, choices
    rows: tuple[int, ...]  # source rollout rows: (correct, wrong) for compare, (wrong,) for fix


def build_tasks(texts: list[str], scores: Scores, group_size: int, examples: list[Example],
                step: int, *, compare: bool = True, fix: bool = True, max_tasks: int = 8,
                correct_key: str = "accuracy", threshold: float = 0.5) -> list[Task]:
    """Tasks from one step's rollouts (`texts` [B*G]); round-robin over the mixed groups."""
    G = group_size
    correct = scores.correct(correct_key, threshold)                                # [B, G]
    per_group = []
    for b, ex in enumerate(examples):
        rows = range(b * G, (b + 1) * G)
        right = [r for r, ok in zip(rows, correct[b].tolist()) if ok and texts[r].strip()]
        wrong = [r for r, ok in zip(rows, correct[b].tolist()) if not ok and texts[r].strip()]
        if not (right and wrong):
            continue
        c, w = right[0], wrong[0]
        found = []
        if compare:
            right_first = random.Random(f"{step}:{b}:{ex.id}").random() < 0.5
            a, bb = (texts[c], texts[w]) if right_first else (texts[w], texts[c])
            found.append(Task("compare", b, Example(
                id=f"{ex.id}#compare@{step}", prompt=COMPARE.format(question=ex.prompt, a=a, b=bb),
                answer="A" if right_first else "B", images=list(ex.images), audios=list(ex.audios),
                choices=["A", "B"]), (c, w)))
        if fix:
            found.append(Task("fix", b, Example(
                id=f"{ex.id}#fix@{step}", prompt=FIX.format(question=ex.prompt, wrong=texts[w]),
                answer=ex.answer, images=list(ex.images), audios=list(ex.audios),
                choices=ex.choices), (w,)))
        per_group.append(found)
    out = []
    for k in range(max((len(f) for f in per_group), default=0)):
        out += [f[k] for f in per_group if k < len(f)]
    return out[:max_tasks]


def task_rewards(tasks: list[Task], texts: list[str], group: int) -> torch.Tensor:
    """1 where a sample's extracted answer matches its task's gold, else 0. [T, group]"""
    from rewards.verify import extract_answer, match

    out = torch.zeros(len(tasks), group)
    for t, task in enumerate(tasks):
        for g in range(group):
            answer = extract_answer(texts[t * group + g])
            out[t, g] = float(answer is not None and match(answer, task.example.answer,
                                                           task.example.choices))
    return out


class TaskRL:
    """Samples, scores and trains the recycled tasks of one step (see the module doc)."""

    def __init__(self, group: int = 4, max_new_tokens: int = 64, temperature: float = 1.0):
        if group < 2:
            raise ValueError(f"recycling: task_group must be >= 2 (advantages need a group), got {group}")
        self.group, self.max_new_tokens, self.temperature = int(group), int(max_new_tokens), float(temperature)
        self.step: int | None = None
        self.batch = None

    def sample(self, policy, tasks: list[Task], step: int) -> dict[str, float]:
        from mmrlvr.algo import group_advantages
        from mmrlvr.rollout import SamplingParams
        from mmrlvr.rollout.hf import HFRolloutEngine

        self.step, self.batch = step, None
        if not tasks:
            return {"tasks": 0.0}
        prompts = policy.adapter.encode([t.example for t in tasks], policy.processor)
        rollouts = HFRolloutEngine(policy).generate(prompts, SamplingParams(
            n=self.group, max_new_tokens=self.max_new_tokens, temperature=self.temperature))
        rewards = task_rewards(tasks, rollouts.texts, self.group)                    # [T, g]
        advantages = group_advantages(rewards, "grpo").flatten()                      # [T*g]
        mask = rollouts.completion_mask
        with torch.no_grad():
            old, _ = policy.rollout_logprobs(rollouts.prompts, [r // self.group for r in range(len(mask))],
                                             rollouts.completion_ids, mask)
        self.batch = (rollouts, advantages, old.detach())
        stats = {"tasks": float(len(tasks)),
                 "task_zero_spread_frac": float((rewards.std(dim=1) == 0).float().mean())}
        for kind in ("compare", "fix"):
            rows = [t for t, task in enumerate(tasks) if task.kind == kind]
            if rows:
                stats[f"task_{kind}_accuracy"] = float(rewards[rows].mean())
        return stats

    def loss(self, policy) -> torch.Tensor | None:
        """The clipped surrogate over this step's task samples (None: nothing to train)."""
        if self.batch is None:
            return None
        rollouts, advantages, old = self.batch
        if not advantages.abs().sum() > 0:
            return None
        mask = rollouts.completion_mask
        logp, _ = policy.rollout_logprobs(rollouts.prompts, [r // self.group for r in range(len(mask))],
                                          rollouts.completion_ids, mask)             # [N, C]
        m = mask.to(logp.device, logp.dtype)
        ratio = torch.exp(logp - old.to(logp.device))                                # [N, C]
        adv = advantages.to(logp.device, logp.dtype).unsqueeze(1)                    # [N, 1]
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
        return -(surrogate * m).sum() / m.sum().clamp(min=1)
