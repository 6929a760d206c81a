"""Difficulty-aware prompt sampling (mmrlvr.methods.difficulty.sampler): the Beta-Binomial likelihood and
one mean-field update by hand, the simulation against uniform order, determinism, resume, the
floor, clear errors, and a GRPO step on the tiny model with the sampler as a drop-in."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mmrlvr.methods.difficulty.sampler import DifficultySampler, beta_binomial_logpmf, log_beta
from mmrlvr.train.sampler import PromptSampler

BENCH = Path(__file__).resolve().parents[1] / "bench" / "difficulty_sampler.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("difficulty_sampler_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_beta_binomial_matches_hand_computation():
    # Beta(1, 1): BB(s | n) = 1/(n+1) for every s, fractional s included (the lgamma extension)
    assert np.exp(beta_binomial_logpmf(1, 2, 1.0, 1.0)) == pytest.approx(1 / 3, abs=1e-12)
    assert np.exp(beta_binomial_logpmf(0.5, 1, 1.0, 1.0)) == pytest.approx(1 / 2, abs=1e-12)
    # BB(2 | 2, a=2, b=1) = E[p²] under Beta(2, 1) = a(a+1)/((a+b)(a+b+1)) = 6/12
    assert np.exp(beta_binomial_logpmf(2, 2, 2.0, 1.0)) == pytest.approx(0.5, abs=1e-12)
    # BB(1 | 3, a=2, b=3) = C(3,1)·B(3, 5)/B(2, 3) = 3·(2!4!/7!)/(1!2!/4!) = 3·(1/105)/(1/12) = 12/35
    assert np.exp(beta_binomial_logpmf(1, 3, 2.0, 3.0)) == pytest.approx(12 / 35, abs=1e-12)
    assert log_beta(2.0, 3.0) == pytest.approx(math.log(1 / 12), abs=1e-12)


def three_prompts(**options):
    # prompts 0 and 1 are the same text (cosine 1); prompt 2 shares no n-gram with them
    return DifficultySampler(["alpha beta", "alpha beta", "gamma delta"], seed=0, states=2,
                             strength=2.0, **{"coupling": 1.0, **options})


def test_graph_links_similar_texts_only():
    s = three_prompts()
    assert sorted(zip(s.src.tolist(), s.dst.tolist())) == [(0, 1), (1, 0)]
    assert s.weight.tolist() == [1.0, 1.0]           # each row normalised to sum 1


def test_one_mean_field_update_on_a_three_prompt_graph():
    # states 2, strength 2: means 0.25 / 0.75, Beta(0.5, 1.5) and Beta(1.5, 0.5)
    s = three_prompts(sweeps=1)
    s.observe([0], [2.0], trials=2)
    # likelihood of 2/2 per state (C(2,2) = 1): E[p²] = a(a+1)/((a+b)(a+b+1)) = 0.125, 0.625
    # field on prompt 0 = q_1 = (½, ½) cancels, so q_0 ∝ (0.125, 0.625) = (1/6, 5/6);
    # synchronous: prompt 1 still sees the old q_0 = (½, ½) and stays put, prompt 2 has no edge
    np.testing.assert_allclose(s.beliefs, [[1 / 6, 5 / 6], [0.5, 0.5], [0.5, 0.5]], atol=1e-12)
    s._sweep()                                      # a second sweep: prompt 1 hears prompt 0
    q1 = np.exp([1 / 6, 5 / 6]) / np.exp([1 / 6, 5 / 6]).sum()
    np.testing.assert_allclose(s.beliefs[1], q1, atol=1e-12)
    np.testing.assert_allclose(s.beliefs[0], [1 / 6, 5 / 6], atol=1e-12)
    # expected variance ×4 of prompt 0: posteriors Beta(2.5, 1.5), Beta(3.5, 0.5)
    v0 = 4 * (1 / 6 * 2.5 * 1.5 / (4 * 5) + 5 / 6 * 3.5 * 0.5 / (4 * 5))
    assert s.expected_variance()[0] == pytest.approx(v0, abs=1e-12)
    v = s.expected_variance() ** 2                  # temperature 0.5
    np.testing.assert_allclose(s.probabilities(), 0.95 * v / v.sum() + 0.05 / 3, atol=1e-12)


def test_coupling_zero_keeps_prompts_apart():
    s = three_prompts(coupling=0.0, sweeps=3)
    s.observe([0], [2.0], trials=2)
    np.testing.assert_allclose(s.beliefs[1], [0.5, 0.5], atol=1e-12)


def test_an_unseen_twin_of_a_never_solved_prompt_is_drawn_less():
    s = DifficultySampler(["red cube count", "red cube count", "blue ball size", "green cone tilt"], 0)
    s.observe([0], [0.0], trials=8)
    p = s.probabilities()
    assert p[1] < p[2] - 0.02 and p[2] == pytest.approx(p[3])   # 1 learnt from 0; 2, 3 unseen


def test_sampler_draws_fewer_zero_spread_groups_than_uniform():
    bench = load_bench()
    for seed in range(3):
        texts, _, rates = bench.synthetic_task(seed)
        uniform, _ = bench.simulate(PromptSampler(len(texts), seed), rates, seed)
        guided, _ = bench.simulate(DifficultySampler(texts, seed), rates, seed)
        # measured: uniform 0.650 / 0.630 / 0.649, sampler 0.275 / 0.282 / 0.261
        assert uniform > 0.55 and guided < uniform - 0.25, (seed, uniform, guided)


def test_same_seed_same_draws_and_draws_are_distinct_within_a_call():
    bench = load_bench()
    texts, _, rates = bench.synthetic_task(0)
    a, b, c = DifficultySampler(texts, 1), DifficultySampler(texts, 1), DifficultySampler(texts, 2)
    rng = np.random.default_rng(0)
    for _ in range(5):
        ia, ib, ic = a.next(8), b.next(8), c.next(8)
        assert ia == ib and len(set(ia)) == 8
        outcomes = rng.binomial(8, rates[ia]).tolist()
        a.observe(ia, outcomes, 8), b.observe(ib, outcomes, 8), c.observe(ic, outcomes, 8)
    assert a.next(8) != c.next(8)
    small = DifficultySampler(["a b", "a c", "b c"], 0)
    draw = small.next(7)                            # rounds of N: 3 + 3 + 1
    assert sorted(draw[:3]) == [0, 1, 2] and sorted(draw[3:6]) == [0, 1, 2] and small.cursor == 7


def test_resume_from_json_state_draws_what_an_uninterrupted_run_draws():
    bench = load_bench()
    texts, families, rates = bench.synthetic_task(1)

    def run(sampler, steps, rng):
        drawn = []
        for _ in range(steps):
            idx = sampler.next(8)
            sampler.observe(idx, (rng.random((8, 8)) < rates[idx][:, None]).mean(1) * 8, 8)
            drawn.append(idx)
        return drawn

    whole = DifficultySampler(texts, 5, families=families, decay=0.97)
    rng = np.random.default_rng(3)
    straight = run(whole, 20, rng)

    first = DifficultySampler(texts, 5, families=families, decay=0.97)
    rng = np.random.default_rng(3)
    before = run(first, 10, rng)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = DifficultySampler(texts, 5, families=families, decay=0.97)
    resumed.load_state_dict(state)
    after = run(resumed, 10, rng)
    assert before + after == straight
    assert np.array_equal(resumed.beliefs, whole.beliefs) and resumed.cursor == whole.cursor == 160


def test_floor_keeps_every_prompt_drawable():
    bench = load_bench()
    texts, _, rates = bench.synthetic_task(0)
    s = DifficultySampler(texts, 0)
    bench.simulate(s, rates, 0, steps=50)
    assert s.probabilities().min() >= 0.05 / len(texts) - 1e-15
    # a small pool with a large floor: every prompt comes up, even the always-solved ones
    texts, rates = texts[:40], rates[:40]
    s = DifficultySampler(texts, 0, floor=0.2)
    _, drawn = bench.simulate(s, rates, 0, steps=500)
    assert drawn == set(range(40))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="floor=1.5"):
        DifficultySampler(["a"], 0, floor=1.5)
    with pytest.raises(ValueError, match="empty dataset"):
        DifficultySampler([], 0)
    s = DifficultySampler(["a b", "a c"], 0)
    with pytest.raises(ValueError, match="prompt 1 has successes 9.0 outside"):
        s.observe([0, 1], [1.0, 9.0], 8)
    with pytest.raises(ValueError, match="2 indices but 1 successes"):
        s.observe([0, 1], [1.0], 8)
    with pytest.raises(ValueError, match="built on other prompts"):
        DifficultySampler(["a b", "a d"], 0).load_state_dict(s.state_dict())


def test_train_sampler_difficulty_observes_every_step_and_resumes_exactly(tmp_path, tiny_vl,
                                                                           shapes_dir):
    """`train.sampler: difficulty` end to end: the step's outcomes reach the sampler (its counts
    equal the rollouts' accuracy), the checkpoint carries its state, and a run resumed from
    step 2 draws and logs what the uninterrupted run did."""
    import shutil

    from mmrlvr.config import load_config
    from mmrlvr.train.checkpoint import load_trainer_state
    from mmrlvr.train.trainer import train

    def config(name):
        return load_config(None, [
            f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
            "rollout.group_size=4", "rollout.max_new_tokens=8", "train.batch_prompts=4",
            "train.micro_batch=16", "train.steps=4", "train.save_every=2", "train.seed=3",
            "train.sampler=difficulty", "train.sampler_options={neighbours: 4, temperature: 0.5}",
            f"train.out_dir={tmp_path / name}"])

    def metrics(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(("time", "rollout/time", "perf"))
                 and not k.endswith("_s")} for r in rows]

    cfg = config("whole")
    train(cfg, progress=False)
    whole = Path(cfg.train.out_dir)
    state = load_trainer_state(whole / "checkpoints" / "step-4")
    sampler = state["sampler"]
    assert sum(sampler["trials"]) == 4 * 4 * 4                     # steps x prompts x members
    rows = metrics(whole)
    accuracy = sum(r["reward/accuracy"] * 16 for r in rows if "reward/accuracy" in r)
    assert sum(sampler["successes"]) == pytest.approx(accuracy, abs=1e-3)

    shutil.copytree(whole, tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-4")
    train(config("resumed"), resume=True, progress=False)
    assert metrics(tmp_path / "resumed") == rows


def test_unknown_sampler_options_are_named(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import make_sampler
    from mmrlvr.data import load_jsonl

    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "train.sampler=difficulty", "train.sampler_options={neighbors: 4}"])
    with pytest.raises(ValueError, match=r"train.sampler_options: unknown option\(s\) \['neighbors'\]"):
        make_sampler(cfg, load_jsonl(shapes_dir / "train.jsonl"))
