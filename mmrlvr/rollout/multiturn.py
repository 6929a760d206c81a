"""Multi-turn rollouts with tools (docs/tools.md): the policy writes a turn; a turn that ends in
a `<tool_call>` (`mmrlvr.core.trajectory`) runs the tool (`mmrlvr.tools`, isolated), the result
(text, an image or an audio clip) is appended as the next turn, and the policy goes on, up to
`rollout.max_turns` turns and `rollout.max_trajectory_tokens` tokens after the prompt.

Every turn of every live trajectory of a step is one batched `generate` call of the wrapped HF
engine: the first samples G members per prompt from one prefill, as a single-turn rollout does;
each later one continues every trajectory from its whole context (`tool_turns.context_batch`:
the prompt, the turns so far, the prompt's media and the tools', left padded). The result is one
`Rollouts` in the usual B·G layout: the completion is everything after the prompt (the policy's
tokens, the template's forced tokens and the tool turns); `loss_mask` is 1 only on the sampled
tokens, and each trajectory gets a prompt row of its own (`prompt_index`) carrying its tools'
media, so the update's forward places them where their tokens stand. Rewards get the final
turn's text as a `Completion` with the `Trajectory` beside it.

Off (`rollout.max_turns: 1`, no `rollout.tools`) the engine is not built at all: the single-turn
path runs untouched. What it does not do: vLLM (a request per turn), branching, packing,
one-step-off rollouts and dynamic sampling are refused with tools (`mmrlvr.config.checks`).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from mmrlvr.core.trajectory import Completion, Trajectory, Turn, cut_after_call, parse_call
from mmrlvr.core.types import PromptBatch, Rollouts
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.rollout.tool_turns import Context, context_batch, encode_turn, tool_content, tool_turn_text


class MultiTurnEngine:
    """Wraps a single-turn engine; its `generate` returns whole trajectories."""

    def __init__(self, inner: Any, policy: Any, runner: Any, max_turns: int, max_tokens: int = 0):
        self.inner, self.policy, self.runner = inner, policy, runner
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self.branching = None

    def wake_up(self) -> None:
        self.inner.wake_up()

    def sleep(self) -> None:
        self.inner.sleep()

    def mark_weights_changed(self) -> None:
        self.inner.mark_weights_changed()

    def without_branching(self) -> "MultiTurnEngine":
        return MultiTurnEngine(self.inner.without_branching(), self.policy, self.runner,
                               self.max_turns, self.max_tokens)

    @torch.no_grad()
    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        t0 = time.perf_counter()
        policy = self.policy
        n = 1 if params.greedy else params.n
        budget = self.max_tokens or self.max_turns * params.max_new_tokens
        contexts = [Context(b) for b in range(len(batch)) for _ in range(n)]
        trajs = [Trajectory() for _ in contexts]
        live = list(range(len(contexts)))
        stats = {"prefill_tokens": 0, "scrubbed": 0, "turn_truncated": 0}
        have_logp = True
        for turn in range(self.max_turns):
            if not live:
                break
            room = max(budget - len(contexts[r].ids) for r in live)
            step = replace(params, max_new_tokens=min(params.max_new_tokens, room))
            if turn == 0:
                out = self.inner.generate(batch, step)
            else:
                step = replace(step, n=1)
                out = self.inner.generate(context_batch(batch, [contexts[r] for r in live],
                                                        policy.pad_id), step)
            stats["prefill_tokens"] += out.stats["rollout/prefill_tokens"]
            stats["scrubbed"] += out.stats["rollout/placeholder_scrubbed"]
            have_logp = have_logp and out.sample_logprobs is not None
            calls = []
            for j, r in enumerate(live):
                call = self._take_turn(out, j, contexts[r], trajs[r], budget, turn, stats)
                if call is not None:
                    calls.append((r, call))
            live = [r for r, _ in calls]
            self._run_tools(batch, calls, contexts, trajs, budget)
            live = [r for r in live if trajs[r].ended == "open"]
        for traj in trajs:
            if traj.ended == "open":
                traj.ended = "max_turns"
        return self._rollouts(batch, n, contexts, trajs, have_logp, stats, t0)

    def _take_turn(self, out: Rollouts, j: int, ctx: Context, traj: Trajectory, budget: int,
                   turn: int, stats: dict) -> Any:
        """Append row `j` of a generate call to its trajectory; returns its tool call (or an
        error text to answer it with) when the trajectory goes on, else None."""
        policy = self.policy
        length = int(out.completion_mask[j].sum())
        ids = out.completion_ids[j, :length].tolist()
        logp = out.sample_logprobs[j, :length].tolist() if out.sample_logprobs is not None else None
        text = out.texts[j]
        if cut_after_call(text) is not None:        # drop what was sampled after </tool_call>
            keep = self._tokens_through_call(ids)
            ids, logp = ids[:keep], logp[:keep] if logp is not None else None
            text = policy.tokenizer.decode(ids, skip_special_tokens=True)
        cut_by_budget = len(ctx.ids) + len(ids) > budget
        if cut_by_budget:
            keep = budget - len(ctx.ids)
            ids, logp = ids[:keep], logp[:keep] if logp is not None else None
            text = policy.tokenizer.decode(ids, skip_special_tokens=True)
        ctx.add(ids, sampled=True, logp=logp)
        call, why = parse_call(text)
        traj.turns.append(Turn(text, call, why))
        ended_eos = bool(ids) and ids[-1] in policy.eos_ids
        if call is None and not why:
            traj.ended = "answer" if ended_eos or not cut_by_budget else "budget"
            stats["turn_truncated"] += int(not ended_eos)
            return None
        if why and not cut_after_call(text):        # an unclosed <tool_call>: nothing to answer
            traj.ended = "bad_call"
            return None
        if turn + 1 >= self.max_turns or cut_by_budget:
            traj.ended = "max_turns" if not cut_by_budget else "budget"
            return None
        traj.ended = "open"
        return call if call is not None else why

    def _tokens_through_call(self, ids: list[int]) -> int:
        """The fewest leading tokens whose text holds a complete `</tool_call>`."""
        decode = self.policy.tokenizer.decode
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if cut_after_call(decode(ids[:mid], skip_special_tokens=True)) is None:
                lo = mid + 1
            else:
                hi = mid
        return hi

    def _run_tools(self, batch: PromptBatch, calls: list, contexts: list[Context],
                   trajs: list[Trajectory], budget: int) -> None:
        """Run the turn's tool calls at once and append each result as a tool turn."""
        from mmrlvr.tools import ToolResult

        runnable = [(r, c) for r, c in calls if not isinstance(c, str)]
        results = dict(zip([r for r, _ in runnable], self.runner.run_all(
            [(batch.examples[contexts[r].prompt], c) for r, c in runnable])))
        for r, call in calls:
            turn, example = trajs[r].turns[-1], batch.examples[contexts[r].prompt]
            result = results.get(r) or ToolResult("error", error=f"bad_call: {call}")
            chunk = None
            if result.kind != "error":
                try:
                    text = tool_turn_text(self.policy.processor, tool_content(result.kind, result.text))
                    chunk = encode_turn(self.policy, example, text, result.image, result.audio)
                except Exception as err:  # noqa: BLE001 — an unusable medium is the tool's error
                    was = result.kind
                    result = ToolResult("error", error=f"bad_result: {type(err).__name__}: {err}")
                    self.runner.count_late_error(was, result)
            if chunk is None:
                message = f"error: {result.error}"
                text = tool_turn_text(self.policy.processor, tool_content("text", message))
                chunk = encode_turn(self.policy, example, text)
                result.text = message
            turn.result_kind, turn.result_text = result.kind, result.text
            turn.tool_error = result.error
            if len(contexts[r].ids) + len(chunk.ids) >= budget:
                trajs[r].ended = "budget"              # no room left to answer after it
                continue
            contexts[r].add(chunk.ids, sampled=False, types=chunk.types, media=chunk.media)

    def _rollouts(self, batch: PromptBatch, n: int, contexts: list[Context],
                  trajs: list[Trajectory], have_logp: bool, stats: dict, t0: float) -> Rollouts:
        policy = self.policy
        N, C = len(contexts), max(1, max(len(c.ids) for c in contexts))
        ids = torch.full((N, C), policy.pad_id, dtype=torch.long)
        mask = torch.zeros(N, C, dtype=torch.long)
        train = torch.zeros(N, C, dtype=torch.long)
        logp = torch.zeros(N, C) if have_logp else None
        for i, c in enumerate(contexts):
            k = len(c.ids)
            ids[i, :k] = torch.tensor(c.ids, dtype=torch.long)
            mask[i, :k] = 1
            train[i, :k] = torch.tensor(c.train, dtype=torch.long)
            if logp is not None:
                logp[i, :k] = torch.tensor(c.logp)
        prompts = context_batch(batch, contexts, policy.pad_id, with_completion=False)
        ended = [t.ended for t in trajs]
        counts = self.runner.take_counts()
        out_stats: dict[str, Any] = {
            "rollout/time_s": time.perf_counter() - t0,
            "rollout/prefill_tokens": stats["prefill_tokens"],
            "rollout/tokens": int(train.sum()),
            "rollout/truncated_frac": sum(e in ("budget", "max_turns") for e in ended) / N,
            "rollout/placeholder_scrubbed": stats["scrubbed"],
            "tools/turns_mean": sum(len(t.turns) for t in trajs) / N,
            "tools/calls_per_rollout": counts.get("calls", 0) / N,
            "tools/tool_token_frac": float(1 - train.sum() / mask.sum().clamp(min=1)),
            "tools/seconds": counts.get("seconds", 0.0),
            "tools/turns_cut": stats["turn_truncated"] / N}
        for kind in ("answer", "max_turns", "budget", "bad_call"):
            out_stats[f"tools/ended_{kind}"] = ended.count(kind) / N
        for key, value in counts.items():
            if key.startswith(("errors_", "results_")):
                out_stats[f"tools/{key}"] = value
        return Rollouts(prompts=prompts, group_size=n, completion_ids=ids, completion_mask=mask,
                        sample_logprobs=logp, texts=[Completion(t.final, t) for t in trajs],
                        branch=["clean"] * N, stats=out_stats, loss_mask=train,
                        prompt_index=list(range(N)))


def with_tools(engine: Any, policy: Any, rollout_cfg: Any) -> Any:
    """The engine the trainer uses: `engine` itself unless `rollout.tools` are configured
    (then a `MultiTurnEngine` around it)."""
    if not rollout_cfg.tools:
        return engine
    from mmrlvr.tools import build_runner

    return MultiTurnEngine(engine, policy, build_runner(rollout_cfg.tools), rollout_cfg.max_turns,
                           rollout_cfg.max_trajectory_tokens)
