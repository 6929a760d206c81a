"""Rollout recycling (StructReward, docs/methods.md): scored groups become supervised instances.

After scoring, each group holding both a correct and a wrong rollout of one prompt yields
    (a) comparison pairs (correct y_w, wrong y_l). The comparison itself is trained
        (`pair_loss: preference`, the default): a pairwise preference loss against the rollout
        policy π_old as reference (DPO's form, with the policy that sampled the pair as the
        reference, so no reference model is loaded):
            L_pair = −log σ(β·[(log π(y_w) − log π_old(y_w)) − (log π(y_l) − log π_old(y_l))])
        with log π(y) the completion's summed token logprob at temperature 1 and β 0.1 (our
        choice). `pair_loss: nll` trains only the chosen side's NLL (the earlier behaviour);
    (b) self-correction instances: prompt + wrong attempt + a bridge ("Wait, let me check
        again.") as context, the correct rollout's tokens as the target.
With `form: tasks` (tasks.py) the same groups become tasks the policy is asked to solve instead:
a comparison (two attempts, "which is right? A or B", gold the right one's letter) and a
self-correction ("this attempt has an error: find and fix it", gold the question's answer),
sampled `task_group` times, scored by the verifier, trained by a clipped surrogate on GRPO
advantages. `pairs` / `self_correction` switch the two kinds in either form.
Inside a group, distinct correct and distinct wrong texts are paired one-to-one in rollout
order. Instances are deduplicated by a hash of (kind, example id, context, target) within the
step, taken round-robin over the groups up to `max_per_step`, and appended to
`RUN_DIR/recycled.jsonl` (step, kind, example id, group, source rollout rows, texts, hash).

    L_nll = − Σ_i Σ_t m_it · log π(y_it | prompt_i, context_i, y_i<t) / Σ_it m_it   (token mean)

over the self-corrections (and, with `pair_loss: nll`, the chosen sides); the objective's loss is
mean_pairs L_pair + L_nll. `m` is 1 on target tokens only: the wrong attempt is attended to (attention mask 1) but never
supervised. Logprobs are at temperature 1 (the model's own distribution, as in SFT); the
target tokens are the rollout's sampled ids, the context is the wrong text re-tokenised.
A rollout is correct when its score dict holds `correct_key` (default `accuracy`: the accuracy
reward's 0/1) and that value is >= `threshold`; otherwise when `overall >= threshold`.
π_old is the policy at the step's first call (before any of its optimiser steps): the
reference logprobs are computed then, without gradient, and reused by later PPO epochs. Nothing
is carried from step to step, so a resumed run recycles exactly as an uninterrupted one; on its
first call a run drops rows of the steps it is about to redo from the file.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mmrlvr.core.types import Scores, select
from mmrlvr.methods.structreward.tasks import TaskRL, build_tasks


@dataclass
class Instance:
    """One recycled training instance, traceable to the rollouts it came from."""

    kind: str
    """`pair` or `self_correction`."""
    group: int
    """Prompt index in the step's batch (rows group*G … group*G+G-1)."""
    example_id: str
    rows: dict[str, int]
    """Source rollout rows: {chosen, rejected} for a pair, {wrong, correct} for self-correction."""
    target_row: int
    """The rollout whose tokens are supervised (always a correct one)."""
    context: str
    """Text between the prompt and the target: '' for a pair, wrong attempt + bridge otherwise."""
    key: str
    """Hash of (kind, example id, context, target text): the dedup key."""


def _distinct(rows: list[int], texts: list[str]) -> list[int]:
    seen, out = set(), []
    for r in rows:
        if texts[r] not in seen:
            seen.add(texts[r])
            out.append(r)
    return out


def _key(kind: str, example_id: str, context: str, target: str) -> str:
    blob = json.dumps([kind, example_id, context, target], ensure_ascii=False)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]


def build_instances(texts: list[str], scores: Scores, group_size: int,
                    example_ids: list[str], *, pairs: bool = True, self_correction: bool = True,
                    bridge: str = "Wait, let me check again.", correct_key: str = "accuracy",
                    threshold: float = 0.5, max_per_step: int = 8
                    ) -> tuple[list[Instance], dict[str, float]]:
    """Instances from one step's rollouts (`texts` [B*G]) and scores ([B][G]), with stats."""
    G = group_size
    per_group: list[list[Instance]] = []
    mixed = 0
    correct = scores.correct(correct_key, threshold)                                # [B, G]
    for b in range(len(scores)):
        rows = range(b * G, (b + 1) * G)
        right = _distinct([r for r, ok in zip(rows, correct[b].tolist()) if ok and texts[r].strip()],
                          texts)
        wrong = _distinct([r for r, ok in zip(rows, correct[b].tolist()) if not ok], texts)
        mixed += bool(right and wrong)
        ex_id = example_ids[b]
        candidates = []
        for c, w in zip(right, wrong):
            if pairs:
                candidates.append(Instance("pair", b, ex_id, {"chosen": c, "rejected": w}, c, "",
                                           _key("pair", ex_id, "", texts[c])))
            if self_correction:
                context = f"{texts[w]}\n{bridge}\n"
                candidates.append(Instance("self_correction", b, ex_id,
                                           {"wrong": w, "correct": c}, c, context,
                                           _key("self_correction", ex_id, context, texts[c])))
        per_group.append(candidates)

    chosen: list[Instance] = []
    seen: set[str] = set()
    duplicates = capped = 0
    for k in range(max((len(c) for c in per_group), default=0)):   # round-robin over groups
        for candidates in per_group:
            if k >= len(candidates):
                continue
            inst = candidates[k]
            if inst.key in seen:
                duplicates += 1
                continue
            seen.add(inst.key)
            if len(chosen) < max_per_step:
                chosen.append(inst)
            else:
                capped += 1
    stats = {"instances": float(len(chosen)),
             "pairs": float(sum(i.kind == "pair" for i in chosen)),
             "self_corrections": float(sum(i.kind == "self_correction" for i in chosen)),
             "mixed_groups": mixed / max(len(scores), 1),
             "duplicates": float(duplicates), "capped": float(capped)}
    return chosen, stats


def collate(contexts: list[list[int]], targets: list[list[int]], pad_id: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded completion ids ([N, C] = context ++ target), attention mask (1 on both
    parts) and loss mask (1 on the target only)."""
    width = max(len(c) + len(t) for c, t in zip(contexts, targets))
    ids = torch.full((len(targets), width), pad_id, dtype=torch.long)           # [N, C]
    attention = torch.zeros((len(targets), width), dtype=torch.long)            # [N, C]
    loss_mask = torch.zeros((len(targets), width), dtype=torch.long)            # [N, C]
    for i, (c, t) in enumerate(zip(contexts, targets)):
        ids[i, :len(c) + len(t)] = torch.tensor(c + t, dtype=torch.long)
        attention[i, :len(c) + len(t)] = 1
        loss_mask[i, len(c):len(c) + len(t)] = 1
    return ids, attention, loss_mask


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class Recycling:
    """The auxiliary supervised loss on recycled rollouts (see the module doc).

    Config: `{name: recycling, weight: 0.1, max_per_step: 8, ...}`; the weight scales the loss.
    """

    name = "recycling"

    def __init__(self, max_per_step: int = 8, pairs: bool = True, self_correction: bool = True,
                 bridge: str = "Wait, let me check again.", correct_key: str = "accuracy",
                 threshold: float = 0.5, pair_loss: str = "preference", beta: float = 0.1,
                 form: str = "supervised", task_group: int = 4, task_max_new_tokens: int = 64,
                 task_temperature: float = 1.0):
        if form not in ("supervised", "tasks"):
            raise ValueError(f"recycling: form must be 'supervised' or 'tasks', got {form!r}")
        self.form = form
        self.tasks = TaskRL(task_group, task_max_new_tokens, task_temperature) if form == "tasks" else None
        if max_per_step < 1:
            raise ValueError(f"recycling: max_per_step must be >= 1, got {max_per_step}")
        if pair_loss not in ("preference", "nll"):
            raise ValueError(f"recycling: pair_loss must be 'preference' or 'nll', got {pair_loss!r}")
        if not beta > 0:
            raise ValueError(f"recycling: beta must be > 0, got {beta}")
        self.pair_loss, self.beta = pair_loss, float(beta)
        self._reference: dict[int, float] = {}
        if not (pairs or self_correction):
            raise ValueError("recycling: pairs and self_correction are both off; "
                             "remove the objective instead")
        self.options = {"pairs": pairs, "self_correction": self_correction, "bridge": bridge,
                        "correct_key": correct_key, "threshold": threshold,
                        "max_per_step": max_per_step}
        self._step: int | None = None
        self._instances: list[Instance] = []
        self._stats: dict[str, float] = {}
        self._trimmed = False

    def loss(self, ctx) -> tuple[torch.Tensor | None, dict[str, float]]:
        if self.tasks is not None:
            return self._task_loss(ctx)
        rollouts, policy = ctx.rollouts, ctx.policy
        if self._step != ctx.step:     # ppo_epochs > 1 calls once per epoch: build and write once
            ids_of = [ex.id for ex in rollouts.prompts.examples]
            self._instances, self._stats = build_instances(
                rollouts.texts, ctx.scores, rollouts.group_size, ids_of, **self.options)
            self._step = ctx.step
            self._reference = {}
            self._write(ctx)
        instances, stats = self._instances, dict(self._stats)
        full_ids, full_mask = rollouts.completion_ids, rollouts.completion_mask  # [B*G, C]
        if not instances:
            stats["tokens"] = 0.0
            if _rank_and_world()[1] == 1:
                return None, stats
            # under DDP every rank must run the same backward passes: a zero loss keeps step
            inputs, _ = select(rollouts.prompts, [0])
            logp, _ = policy.completion_logprobs(inputs, full_ids[:1, :1],
                                                 torch.ones_like(full_mask[:1, :1]))
            return logp.sum() * 0.0, stats
        preference = [i for i in instances if i.kind == "pair" and self.pair_loss == "preference"]
        supervised = [i for i in instances if i not in preference]
        loss = 0.0
        if preference:
            pair_loss, pair_stats = self._preference_loss(policy, rollouts, preference)
            loss = loss + pair_loss
            stats.update(pair_stats)
        if supervised:
            nll, tokens = self._nll(policy, rollouts, supervised)
            loss = loss + nll
            stats["tokens"] = tokens
        return loss, stats

    def _task_loss(self, ctx) -> tuple[torch.Tensor | None, dict[str, float]]:
        """`form: tasks` (tasks.py): comparison and self-correction tasks, sampled and scored
        once per step, trained by their clipped surrogate every epoch."""
        if _rank_and_world()[1] > 1:
            raise ValueError("recycling form: tasks runs in one process only (its extra generate is "
                             "not spread over ranks); use form: supervised under several processes")
        if self._step != ctx.step:
            o = self.options
            tasks = build_tasks(ctx.rollouts.texts, ctx.scores, ctx.rollouts.group_size,
                                list(ctx.rollouts.prompts.examples), ctx.step,
                                compare=o["pairs"], fix=o["self_correction"],
                                max_tasks=o["max_per_step"], correct_key=o["correct_key"],
                                threshold=o["threshold"])
            self._step, self._stats = ctx.step, self.tasks.sample(ctx.policy, tasks, ctx.step)
            self._write_tasks(ctx, tasks)
        return self.tasks.loss(ctx.policy), dict(self._stats)

    def _write_tasks(self, ctx, tasks) -> None:
        if ctx.run_dir is None:
            return
        path = Path(ctx.run_dir) / "recycled.jsonl"
        if not self._trimmed:          # a resumed run redoes steps >= ctx.step
            self._trimmed = True
            if path.is_file():
                kept = [ln for ln in path.read_text(encoding="utf-8").splitlines()
                        if ln.strip() and json.loads(ln)["step"] < ctx.step]
                path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        with path.open("a", encoding="utf-8") as fh:
            for t in tasks:
                fh.write(json.dumps({"step": ctx.step, "kind": t.kind, "group": t.group,
                                     "example_id": t.example.id, "rows": list(t.rows),
                                     "prompt": t.example.prompt, "answer": t.example.answer},
                                    ensure_ascii=False) + "\n")

    def _nll(self, policy, rollouts, instances: list[Instance]) -> tuple[torch.Tensor, float]:
        full_ids, full_mask = rollouts.completion_ids, rollouts.completion_mask  # [B*G, C]
        tokenizer = policy.tokenizer
        targets = [full_ids[i.target_row, :int(full_mask[i.target_row].sum())].tolist()
                   for i in instances]
        contexts = [tokenizer(i.context, add_special_tokens=False)["input_ids"] if i.context
                    else [] for i in instances]
        ids, attention, loss_mask = collate(contexts, targets, policy.pad_id)   # [N, C] each
        inputs, _ = select(rollouts.prompts, [i.group for i in instances])      # [N, P]
        logp, _ = policy.completion_logprobs(inputs, ids, attention)            # [N, C]
        m = loss_mask.to(logp.device, logp.dtype)                               # [N, C]
        return -(logp * m).sum() / m.sum().clamp(min=1), float(m.sum())

    def _preference_loss(self, policy, rollouts, pairs: list[Instance]
                         ) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over pairs of −log σ(β·margin); the rollouts' summed logprobs at temperature 1."""
        rows = sorted({r for i in pairs for r in (i.rows["chosen"], i.rows["rejected"])})
        G, mask = rollouts.group_size, rollouts.completion_mask[rows]
        width = max(int(mask.sum(dim=1).max()), 1)
        ids, mask = rollouts.completion_ids[rows, :width], mask[:, :width]
        logp, _ = policy.rollout_logprobs(rollouts.prompts, [r // G for r in rows], ids, mask)
        seq = (logp * mask.to(logp.device, logp.dtype)).sum(dim=1)              # [R]
        if not self._reference:                  # the rollout policy: this step's first call
            self._reference = {r: float(v) for r, v in zip(rows, seq.detach())}
        at = {r: k for k, r in enumerate(rows)}
        ref = torch.tensor([[self._reference[i.rows["chosen"]], self._reference[i.rows["rejected"]]]
                            for i in pairs], device=seq.device, dtype=seq.dtype)  # [n, 2]
        cur = torch.stack([seq[[at[i.rows["chosen"]] for i in pairs]],
                           seq[[at[i.rows["rejected"]] for i in pairs]]], dim=1)  # [n, 2]
        margin = self.beta * ((cur[:, 0] - ref[:, 0]) - (cur[:, 1] - ref[:, 1]))   # [n]
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        won = (cur[:, 0] - ref[:, 0] > cur[:, 1] - ref[:, 1]).float().mean()
        return loss, {"pair_loss": float(loss.detach()), "pair_margin": float(margin.detach().mean()),
                      "pair_chosen_gains": float(won)}

    def _write(self, ctx) -> None:
        if ctx.run_dir is None:
            return
        rank = _rank_and_world()[0]
        path = Path(ctx.run_dir) / ("recycled.jsonl" if rank == 0 else f"recycled.rank{rank}.jsonl")
        if not self._trimmed:          # a resumed (or re-used) run redoes steps >= ctx.step
            self._trimmed = True
            if path.is_file():
                kept = [ln for ln in path.read_text(encoding="utf-8").splitlines()
                        if ln.strip() and json.loads(ln)["step"] < ctx.step]
                path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        if not self._instances:
            return
        texts, examples = ctx.rollouts.texts, ctx.rollouts.prompts.examples
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            for inst in self._instances:
                row = {"step": ctx.step, **asdict(inst), "prompt": examples[inst.group].prompt,
                       "target": texts[inst.target_row]}
                if inst.kind == "pair":
                    row["rejected"] = texts[inst.rows["rejected"]]
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
