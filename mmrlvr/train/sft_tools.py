"""SFT on gold multi-turn trajectories (docs/tools.md, "Warm start"): a tiny random model never
writes a `<tool_call>` by itself, so `mmrlvr sft` with `rollout.tools` configured teaches the
call by teacher forcing on each row's `meta.trajectory` (the zoom task writes one per row).

A row's trajectory is a list of turns `[{"text": ...}, ...]`: every turn but the last must be
one tool call (`mmrlvr.core.trajectory.parse_call`), the last is the final answer. The calls run
through the run's own tools (`rollout.tools`, the same runner and isolation as a rollout), and
each result becomes a tool turn exactly as `mmrlvr.rollout.multiturn` appends one (the chat
template's delta, the medium through the processor). The target then has the layout a rollout
has: the call's tokens, the tool turn, the answer's tokens and EOS; the loss mask is 1 on the
policy's own tokens (call, answer, EOS) and 0 on the tool turn, so the model learns to call and
to read the result, never to write the result. Each row gets a prompt row of its own carrying
the tool's media (`tool_turns.context_batch`), as the GRPO update scores it.
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.core.trajectory import parse_call
from mmrlvr.core.types import PromptBatch
from mmrlvr.data import DataError, Example
from mmrlvr.rollout.tool_turns import (Context, context_batch, encode_turn, tool_content,
                                       tool_turn_text)


def tool_runner(rollout_cfg: Any) -> Any:
    """The run's tools when `rollout.tools` is set (SFT then trains on trajectories), else None."""
    if not rollout_cfg.tools:
        return None
    from mmrlvr.tools import build_runner

    return build_runner(rollout_cfg.tools)


def gold_turns(ex: Example) -> list[tuple[str, Any]]:
    """(text, call or None) per turn of the row's gold trajectory; a DataError names what is
    wrong with it and what to do."""
    turns = (ex.meta or {}).get("trajectory")
    fix = ("give the row meta.trajectory = [{text: '<tool_call>...</tool_call>'}, ..., "
           "{text: final answer}] (mmrlvr data zoom writes it), or leave rollout.tools out of "
           "the SFT config to train on single-turn targets")
    if not isinstance(turns, list) or not turns or not all(
            isinstance(t, dict) and isinstance(t.get("text"), str) for t in turns):
        raise DataError(f"sample {ex.id}: SFT with rollout.tools needs a gold trajectory; {fix}")
    out = []
    for i, turn in enumerate(turns):
        call, why = parse_call(turn["text"])
        last = i == len(turns) - 1
        if last and (call is not None or why):
            raise DataError(f"sample {ex.id}: the last turn of meta.trajectory calls a tool; it "
                            f"must be the final answer ({fix})")
        if not last and call is None:
            raise DataError(f"sample {ex.id}: turn {i} of meta.trajectory is not a tool call "
                            f"({why or 'no <tool_call> block'}); {fix}")
        out.append((turn["text"], call))
    return out


def trajectory_targets(policy: Any, examples: list[Example], prompts: PromptBatch, runner: Any
                       ) -> tuple[PromptBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt rows with the tools' media, ids [N, C], attention mask [N, C], loss mask [N, C])
    of the rows' gold trajectories after their encoded `prompts`."""
    tok, eos = policy.tokenizer, policy.eos_ids[0]
    contexts = [Context(i) for i in range(len(examples))]
    plans = [gold_turns(ex) for ex in examples]
    for turn in range(max(len(p) for p in plans)):
        calls = []
        for i, plan in enumerate(plans):
            if turn >= len(plan):
                continue
            text, call = plan[turn]
            ids = tok(text, add_special_tokens=False)["input_ids"]
            contexts[i].add(ids + ([eos] if call is None else []), sampled=True)
            if call is not None:
                calls.append((i, call))
        results = runner.run_all([(examples[i], call) for i, call in calls])
        for (i, call), result in zip(calls, results):
            ex = examples[i]
            if result.kind == "error":
                raise DataError(f"sample {ex.id}: its gold call {call.name}({call.arguments}) "
                                f"failed ({result.error}); fix the row's meta.trajectory or the "
                                "tool")
            text = tool_turn_text(policy.processor, tool_content(result.kind, result.text))
            chunk = encode_turn(policy, ex, text, result.image, result.audio)
            contexts[i].add(chunk.ids, sampled=False, types=chunk.types, media=chunk.media)
    runner.take_counts()
    rows = context_batch(prompts, contexts, policy.pad_id, with_completion=False)
    width = max(len(c.ids) for c in contexts)
    ids = torch.full((len(contexts), width), policy.pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    train = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, :len(c.ids)] = torch.tensor(c.ids)
        mask[i, :len(c.ids)] = 1
        train[i, :len(c.ids)] = torch.tensor(c.train)
    return rows, ids, mask, train
