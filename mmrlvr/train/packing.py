"""Padding-free training forwards (`train.packing`): a micro-batch's prompts and completions
packed into a few rows, each prompt once.

A micro-batch of GRPO rows holds completions of a few prompts. A group — one prompt's real
tokens (media included, left padding dropped) followed by each of its completions back to back —
is laid whole into a row; the groups are bin-packed (largest first) into rows as long as the
longest group. A block mask lets a completion see its own prompt and its own earlier tokens,
nothing of its siblings or of the other groups in its row, and every token keeps the position
it has in its own padded row. So no completion padding and no prompt padding runs, no prompt
runs twice, and no key/value cache is kept, which also serves FSDP2 and gradient
checkpointing (where `Policy.rollout_logprobs` runs every row whole). The logprobs and
gradients are those of the unpacked path up to float summation order (tests/test_packing.py).
With `train.packing` on, `Policy.rollout_logprobs` itself comes here, so the update, the
behaviour copy of one-step-off and every method's forward take the same path.

Trade-off: attention inside a row is dense over the row (sdpa or eager with a 4-D mask;
flash-attention cannot take one), so rows of many long completions pay attention work for
pairs the mask discards, while the linear layers skip the padding: it pays on wide models and
loses on narrow ones with long completions (`python bench/packing.py`, docs/grpo-step.md).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrlvr.config.schema import PACKING_ATTENTION
from mmrlvr.core.types import PromptBatch, select, to_device
from mmrlvr.train.logprobs import token_logprobs

Policy = Any
"""`mmrlvr.train.policy.Policy`, which calls in here (`Policy.packing`): named, not imported."""


class Layout:
    """Where every token of a micro-batch sits in the packed rows.

    `prompt_rows`: [N] prompt index per completion; `lengths`: [N] completion lengths;
    `prompt_lengths`: real tokens per prompt index. A group takes its prompt's real tokens,
    then the inputs of its completions (each but its last token), member after member in row
    order; groups go largest first into the first row with room (rows as long as the longest
    group).
    """

    def __init__(self, prompt_rows: list[int], lengths: list[int], prompt_lengths: dict[int, int]):
        self.distinct = list(dict.fromkeys(prompt_rows))
        members = {u: [j for j, r in enumerate(prompt_rows) if r == u] for u in self.distinct}
        inputs = [max(n - 1, 0) for n in lengths]
        size = {u: prompt_lengths[u] + sum(inputs[j] for j in members[u]) for u in self.distinct}
        self.width = max(max(size.values(), default=0), 1)                 # W: row length
        fill: list[int] = []
        self.row_of, self.start = {}, {}
        for u in sorted(self.distinct, key=lambda u: -size[u]):           # first fit decreasing
            row = next((r for r, used in enumerate(fill) if used + size[u] <= self.width), len(fill))
            if row == len(fill):
                fill.append(0)
            self.row_of[u], self.start[u] = row, fill[row]
            fill[row] += size[u]
        self.rows, self.used = len(fill), fill
        # prompts in the order their tokens (and media) appear: row by row, left to right
        self.order = sorted(self.distinct, key=lambda u: (self.row_of[u], self.start[u]))
        self.prompt_lengths = {u: prompt_lengths[u] for u in self.distinct}
        self.offset = []                                # each completion's first input position
        cursor = {u: self.start[u] + prompt_lengths[u] for u in self.distinct}
        for j, u in enumerate(prompt_rows):
            self.offset.append(cursor[u])
            cursor[u] += inputs[j]
        self.prompt_rows, self.inputs = prompt_rows, inputs

    def last_prompt_position(self, u: int) -> int:
        """Position (in its row) of prompt u's last token, whose logits predict every member's
        first token."""
        return self.start[u] + self.prompt_lengths[u] - 1

    def segments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([R, W] owner, [R, W] segment): the prompt each position belongs to (-1 on padding)
        and the completion it feeds (-1 on prompt tokens, -2 on padding)."""
        owner = torch.full((self.rows, self.width), -1, dtype=torch.long)
        seg = torch.full((self.rows, self.width), -2, dtype=torch.long)
        for u in self.distinct:
            r, a = self.row_of[u], self.start[u]
            owner[r, a:a + self.prompt_lengths[u]] = u
            seg[r, a:a + self.prompt_lengths[u]] = -1
        for j, u in enumerate(self.prompt_rows):
            r, o = self.row_of[u], self.offset[j]
            owner[r, o:o + self.inputs[j]] = u
            seg[r, o:o + self.inputs[j]] = j
        return owner, seg

    def completion_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(completion, column, row, position): completion input `column` - 1 sits at `position`
        of `row`, and the logits there predict token `column` (>= 1)."""
        comp, cols, rows, pos = [], [], [], []
        for j, u in enumerate(self.prompt_rows):
            n = self.inputs[j]
            comp += [j] * n
            cols += range(1, n + 1)
            rows += [self.row_of[u]] * n
            pos += range(self.offset[j], self.offset[j] + n)
        as_long = lambda v: torch.tensor(v, dtype=torch.long)   # noqa: E731
        return as_long(comp), as_long(cols), as_long(rows), as_long(pos)

    def prompt_index(self, width: int) -> tuple[torch.Tensor, ...]:
        """(row, position, source, column): prompt `order[source]`'s real token at `column` of
        its left-padded ids (`width` wide) goes to `position` of `row`."""
        rows, pos, src, cols = [], [], [], []
        for i, u in enumerate(self.order):
            n = self.prompt_lengths[u]
            rows += [self.row_of[u]] * n
            pos += range(self.start[u], self.start[u] + n)
            src += [i] * n
            cols += range(width - n, width)
        return tuple(torch.tensor(v, dtype=torch.long) for v in (rows, pos, src, cols))

    def padded_positions(self) -> int:
        """Positions of the packed rows that are padding."""
        return self.rows * self.width - sum(self.used)


def block_mask(owner: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """[R, W, W] True where a query may attend a key: causal, within the query's own group,
    prompt keys and the keys of its own completion; every position sees itself (so no row is
    empty; padded positions are never read)."""
    W = owner.shape[1]
    q_owner, k_owner = owner[:, :, None], owner[:, None, :]
    q_seg, k_seg = seg[:, :, None], seg[:, None, :]
    allowed = torch.ones(W, W, dtype=torch.bool).tril() & (k_owner == q_owner) & (k_owner >= 0) \
        & ((k_seg == q_seg) | (k_seg == -1))
    return allowed | torch.eye(W, dtype=torch.bool)


def packed_logprobs(policy: Policy, prompts: PromptBatch, prompt_rows: list[int],
                    ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0,
                    with_entropy: bool = False, model: torch.nn.Module | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`Policy.rollout_logprobs` (same arguments, same [N, C] results) through packed rows."""
    kind = policy.attn_implementation
    if kind not in PACKING_ATTENTION:
        raise ValueError(f"train.packing needs an attention implementation that takes a 4-D mask "
                         f"({', '.join(PACKING_ATTENTION)}); the model runs {kind!r}")
    N, C = ids.shape
    layout = Layout(prompt_rows, [int(n) for n in mask.sum(dim=1).tolist()],
                    prompt_lengths(prompts, prompt_rows))
    R, W = layout.rows, layout.width
    comp, cols, rows, pos = index = layout.completion_index()
    full = _packed_inputs(policy, prompts, prompt_rows, ids, mask, layout, index, model)
    owner, seg = layout.segments()
    allowed = block_mask(owner, seg).to(policy.device)[:, None]                 # [R, 1, W, W]
    if kind == "eager":                      # eager attention adds the mask to its scores
        dtype = policy.compute_dtype
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=policy.device).masked_fill(
            ~allowed, torch.finfo(dtype).min)
    full["attention_mask"] = allowed

    # logits only where some row needs them: completion inputs and each prompt's last token
    last = {u: layout.last_prompt_position(u) for u in layout.distinct}
    keep = torch.unique(torch.cat([pos, torch.tensor(list(last.values()), dtype=torch.long)]))
    at = torch.full((W,), -1, dtype=torch.long)
    at[keep] = torch.arange(len(keep))
    with policy.autocast():
        logits = (model if model is not None else policy.forward_model)(
            **full, use_cache=False, logits_to_keep=keep.to(policy.device)).logits
    if logits.shape[1] != len(keep):         # models without `logits_to_keep` keep every position
        logits = logits[:, keep.to(logits.device)]                                 # [R, K, V]
    device = logits.device
    targets = torch.zeros(R, len(keep), dtype=torch.long)
    targets[rows, at[pos]] = ids[comp, cols].long()
    lp_rest, ent_rest = token_logprobs(logits, targets.to(device), temperature, with_entropy)
    first_at = (torch.tensor([layout.row_of[u] for u in prompt_rows], device=device),
                torch.tensor([int(at[last[u]]) for u in prompt_rows], device=device))
    lp_first, ent_first = token_logprobs(logits[first_at][:, None], ids[:, :1].to(device),
                                         temperature, with_entropy)                  # [N, 1]

    def unpack(first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(N, C, dtype=rest.dtype, device=device)
        out = out.index_put((torch.arange(N, device=device),
                             torch.zeros(N, dtype=torch.long, device=device)), first[:, 0])
        return out.index_put((comp.to(device), cols.to(device)),
                             rest[rows.to(device), at[pos].to(device)])

    entropy = unpack(ent_first, ent_rest) if with_entropy else None
    return unpack(lp_first, lp_rest), entropy


def _packed_inputs(policy: Policy, prompts: PromptBatch, prompt_rows: list[int],
                   ids: torch.Tensor, mask: torch.Tensor, layout: Layout,
                   index: tuple[torch.Tensor, ...], model: torch.nn.Module | None) -> dict:
    """Forward kwargs of the packed rows (all but the mask): ids, positions and token types
    laid out by `layout` (`index`: its `completion_index`), the prompts' media in the order
    the rows hold them."""
    R, W = layout.rows, layout.width
    prompt_in, _ = select(prompts, layout.order)
    P = prompt_in["input_ids"].shape[1]
    comp, cols, rows, pos = index
    p_rows, p_pos, p_src, p_col = layout.prompt_index(P)

    def scatter(prompt_part: torch.Tensor, completion_part: torch.Tensor | None, fill) -> torch.Tensor:
        """[(3,) R, W] from a prompt-side [(3,) U, P] and a completion-side [(3,) n] tensor."""
        out = prompt_part.new_full(prompt_part.shape[:-2] + (R, W), fill)
        dev = out.device
        out[..., p_rows.to(dev), p_pos.to(dev)] = prompt_part[..., p_src.to(dev), p_col.to(dev)]
        if completion_part is not None:
            out[..., rows.to(dev), pos.to(dev)] = completion_part.to(dev)
        return out

    full = {k: v for k, v in prompt_in.items() if k not in ("input_ids", "attention_mask")}
    full["input_ids"] = scatter(prompt_in["input_ids"], ids[comp, cols - 1], policy.pad_id)
    if "mm_token_type_ids" in prompt_in:
        full["mm_token_type_ids"] = scatter(prompt_in["mm_token_type_ids"], None, 0)
    full = to_device(full, policy.device, policy.dtype)
    positions = _row_positions(policy, prompts, prompt_rows, ids, mask)     # [(3,) N, P+C]
    own = [prompt_rows.index(u) for u in layout.order]     # a completion row of each prompt
    dev = positions.device
    full["position_ids"] = scatter(positions[..., own, :P],
                                   positions[..., comp.to(dev), P + cols.to(dev) - 1], 0)
    media = policy.shared_media(prompts, layout.order, model)
    if media is not None:
        full = policy.adapter.apply_media(model if model is not None else policy.base_model(),
                                          full, media)
    return full


def prompt_lengths(prompts: PromptBatch, prompt_rows: list[int]) -> dict[int, int]:
    """Real (unpadded) tokens of each prompt among `prompt_rows`."""
    real = prompts.inputs["attention_mask"].sum(dim=1)
    return {u: int(real[u]) for u in dict.fromkeys(prompt_rows)}


def _row_positions(policy: Policy, prompts: PromptBatch, prompt_rows: list[int],
                   ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """Position ids [(3,) N, P + C] of the whole rows prompt ++ completion, as
    `Policy.training_inputs` gives them, computed without copying the media features (the ids,
    masks and grids decide positions)."""
    kept = {k for k, v in prompts.inputs.items() if torch.is_tensor(v) and not v.is_floating_point()}
    light = dataclasses.replace(prompts, inputs={k: prompts.inputs[k] for k in kept},
                                media_rows=[{k: r for k, r in row.items() if k in kept}
                                            for row in prompts.media_rows])
    inputs, _ = select(light, prompt_rows)
    rows = to_device(policy.adapter.training_inputs(inputs, ids, mask), policy.device)
    positions = policy.adapter.position_ids(policy.base_model(), rows)
    if positions is None:        # positions over the real tokens, as `generate` counts them
        positions = (rows["attention_mask"].long().cumsum(-1) - 1).clamp(min=0)
    return positions


def packed_padded_fraction(prompts: PromptBatch, mask: torch.Tensor, micro: list[list[int]],
                           group_size: int) -> float:
    """`update.padded_fraction` under packing: the share of the packed rows' positions (prompts
    included) the micro-batches run that are padding."""
    run = padded = 0
    for part in micro:
        rows = [r // group_size for r in part]
        layout = Layout(rows, [int(n) for n in mask[part].sum(dim=1)], prompt_lengths(prompts, rows))
        run += layout.rows * layout.width
        padded += layout.padded_positions()
    return padded / run if run else 0.0
