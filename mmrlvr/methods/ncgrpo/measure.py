"""What NC-GRPO's noise does to a model, per α: `python -m mmrlvr.methods.ncgrpo.measure`.

For each α (and for `image_noise` σ with --sigmas) it samples one call of G members per prompt
through the HF engine and prints the call's `ncgrpo/*` figures (first-step KL(noisy ‖ clean) at
the temperature, the clean entropy, their ratio), then greedy answers: the same call with
`top_k 1` (every member greedy, noise still on), reporting the share of noisy members whose
greedy answer differs from their group's clean greedy answer. The figures in docs/ncgrpo.md
came from it. Weights are never updated.
"""
from __future__ import annotations

import argparse
import json

import torch


def main(argv: list[str] | None = None) -> None:
    import modalities
    from mmrlvr.config import DataConfig, ModelConfig
    from mmrlvr.config.flags import config_flag
    from mmrlvr.core.prompting import Prompting
    from mmrlvr.data import load_split
    from mmrlvr.train.policy import Policy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="JSONL rows (the first --prompts are used)")
    config_flag(ap, "model.modality")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    config_flag(ap, "rollout.temperature")
    ap.add_argument("--tokens", type=int, default=32, help="greedy answer length")
    ap.add_argument("--alphas", default="0,0.1,0.3,1,3")
    ap.add_argument("--sigmas", default="", help="image_noise σ values (vision prompts)")
    config_flag(ap, "data.format_prompt")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    policy = Policy.load(ModelConfig(path=args.model), modalities.get(args.modality), torch.device("cpu"))
    rows = list(load_split(DataConfig(train=args.data), "train"))[: args.prompts]
    batch = Prompting(format=args.format_prompt or "").encode(policy, rows)
    arms = [{"kind": "latent_noise", "alpha": float(a)} for a in args.alphas.split(",") if a] + \
           [{"kind": "image_noise", "sigma": float(s)} for s in args.sigmas.split(",") if s]
    for arm in arms:
        print(json.dumps({**arm, **measure_arm(policy, batch, arm, args.group, args.temperature,
                                               args.tokens)}))


def measure_arm(policy, batch, arm: dict, group: int = 8, temperature: float = 1.0,
                tokens: int = 32) -> dict[str, float]:
    """One arm's figures on `batch`: the `ncgrpo/*` figures of one sampled first step of G
    members per prompt, and `greedy_answer_changed_frac` (module docstring). Seeds 1 for each."""
    from mmrlvr.rollout import SamplingParams, make_engine
    from mmrlvr.rollout.diversity import final_answers

    engine = make_engine("hf", policy, arm)
    torch.manual_seed(1)
    figures = engine.generate(batch, SamplingParams(n=group, max_new_tokens=1,
                                                    temperature=temperature)).stats
    torch.manual_seed(1)
    greedy = engine.generate(batch, SamplingParams(n=group, max_new_tokens=tokens,
                                                   temperature=1.0, top_k=1))
    answers = final_answers(greedy)
    changed = [answers[r] != answers[r - r % group] for r in range(len(answers))
               if greedy.branch[r] == "noisy"]
    out = {k: round(float(v), 6) for k, v in figures.items() if k.startswith("ncgrpo/")}
    out["greedy_answer_changed_frac"] = round(sum(changed) / max(len(changed), 1), 4)
    out["noisy_members"] = float(len(changed))
    return out


if __name__ == "__main__":
    main()
