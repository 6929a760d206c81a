"""Policy logprobs, media slicing and rollout hygiene on a tiny real Qwen2.5-VL (and Qwen2-VL)."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

import modalities
from mmrlvr.config import ModelConfig
from mmrlvr.data import DataError, Example
from mmrlvr.train.policy import Policy
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.rollout.base import completion_mask, scrub_placeholders
from mmrlvr.core.types import select, subset


def _image(tmp_path, name, size, colour):
    path = tmp_path / f"{name}.png"
    Image.new("RGB", (size, size), colour).save(path)
    return str(path)


@pytest.fixture()
def mixed_examples(tmp_path):
    """0, 1 and 2 images, different sizes (4 and 16 image tokens), different prompt lengths."""
    a = _image(tmp_path, "a", 56, (220, 20, 20))
    b = _image(tmp_path, "b", 112, (20, 60, 220))
    return [
        Example(id="none", prompt="What is 2 + 3?", answer="5"),
        Example(id="one", prompt="What colour is the shape?", answer="red", images=[a]),
        Example(id="two", prompt="How many shapes are there in these two pictures together?",
                answer="2", images=[b, a]),
    ]


def _completions(policy, n, widths):
    gen = torch.Generator().manual_seed(1)
    vocab = len(policy.tokenizer) - 20          # stay clear of the special tokens at the top
    ids = torch.randint(0, vocab, (n, max(widths)), generator=gen)
    mask = torch.zeros_like(ids)
    for i, w in enumerate(widths):
        mask[i, :w] = 1
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, policy.pad_id))
    return ids, mask


def _logprobs(policy, batch, rows, ids, mask):
    inputs, _ = select(batch, rows)
    with torch.no_grad():
        logp, _ = policy.completion_logprobs(inputs, ids, mask)
    return logp


@pytest.mark.parametrize("which", ["qwen2.5-vl", "qwen2-vl"])
def test_padded_batch_logprobs_equal_each_alone(which, tiny_vl, tiny_qwen2vl, mixed_examples):
    path = tiny_vl if which == "qwen2.5-vl" else tiny_qwen2vl
    policy = Policy.load(ModelConfig(path=str(path)), modalities.get("vision"), torch.device("cpu"))
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    ids, mask = _completions(policy, 3, [5, 9, 2])
    together = _logprobs(policy, batch, [0, 1, 2], ids, mask)
    for i in range(3):
        alone_batch = policy.adapter.encode([mixed_examples[i]], policy.processor)
        w = int(mask[i].sum())
        alone = _logprobs(policy, alone_batch, [0], ids[i:i + 1, :w], mask[i:i + 1, :w])
        torch.testing.assert_close(together[i, :w], alone[0], atol=2e-5, rtol=1e-4)


def test_media_rows_cut_whole_images_per_sample(policy, mixed_examples):
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    grid = batch.inputs["image_grid_thw"]
    assert grid.shape[0] == 3                                   # 0 + 1 + 2 images
    assert batch.media_rows[0] == {}
    patches = [int(g.prod()) for g in grid]
    assert batch.media_rows[1]["pixel_values"] == (0, patches[0])
    assert batch.media_rows[2]["pixel_values"] == (patches[0], patches[0] + patches[1] + patches[2])
    # repeating and reordering samples carries exactly their own media rows
    rep = subset(batch, [2, 2, 0, 1])
    assert rep.inputs["image_grid_thw"].tolist() == (grid[1:].tolist() * 2) + grid[:1].tolist()
    pv = batch.inputs["pixel_values"]
    two = pv[batch.media_rows[2]["pixel_values"][0]:batch.media_rows[2]["pixel_values"][1]]
    torch.testing.assert_close(rep.inputs["pixel_values"][:2 * len(two)], torch.cat([two, two]))
    # a subset without images carries no media tensors at all
    assert "pixel_values" not in subset(batch, [0, 0]).inputs


def test_image_token_count_mismatch_names_the_sample(policy, tmp_path):
    bad = Example(id="row-17", prompt="Look: <|image_pad|> what is it?", answer="x")
    with pytest.raises(DataError, match="row-17"):
        policy.adapter.encode([bad], policy.processor)


def test_missing_or_corrupt_image_names_sample_and_file(policy, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"s-1.*broken\.png"):
        policy.adapter.encode([Example(id="s-1", prompt="q", answer="a", images=[str(broken)])],
                              policy.processor)
    with pytest.raises(DataError, match=r"s-2.*nowhere\.png"):
        policy.adapter.encode([Example(id="s-2", prompt="q", answer="a",
                                       images=[str(tmp_path / "nowhere.png")])], policy.processor)


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 6, 9, 7, 9], [5, 5, 5, 5, 5], [9, 1, 1, 1, 1]])
    assert completion_mask(ids, [9]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_scrub_cuts_completion_at_first_placeholder():
    ids = torch.tensor([[5, 6, 42, 7, 9], [5, 5, 5, 9, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    new_ids, new_mask, rows = scrub_placeholders(ids, mask, [42], pad_id=0)
    assert rows == 1
    assert new_mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]
    assert new_ids.tolist() == [[5, 6, 0, 0, 0], [5, 5, 5, 9, 0]]


def test_sampled_placeholders_never_reach_the_recompute(policy, mixed_examples, monkeypatch):
    """Even if the sampler emits media placeholders (e.g. another backend), they are cut off."""
    engine = make_engine("hf", policy)
    image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    real_generate = policy.model.generate

    def generate_with_placeholder(**kwargs):
        out = real_generate(**kwargs)
        out.sequences[:, -3] = image_pad          # inject into every completion
        return out

    monkeypatch.setattr(policy.model, "generate", generate_with_placeholder)
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    roll = engine.generate(batch, SamplingParams(n=2, max_new_tokens=8))
    kept = roll.completion_ids[roll.completion_mask.bool()]
    assert not torch.isin(kept, torch.tensor(policy.placeholder_ids)).any()
    assert roll.stats["rollout/placeholder_scrubbed"] > 0


def test_placeholders_are_suppressed_at_sampling(policy, mixed_examples):
    engine = make_engine("hf", policy)
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    torch.manual_seed(0)
    roll = engine.generate(batch, SamplingParams(n=8, max_new_tokens=16, temperature=3.0))
    assert not torch.isin(roll.completion_ids, torch.tensor(policy.placeholder_ids)).any()
    assert roll.stats["rollout/placeholder_scrubbed"] == 0


def test_each_rollout_row_belongs_to_its_own_prompt(policy, mixed_examples):
    """Row b*G+g was sampled from prompt b: its sample logprobs match that prompt, not another."""
    engine = make_engine("hf", policy)
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    torch.manual_seed(0)
    G = 4
    roll = engine.generate(batch, SamplingParams(n=G, max_new_tokens=8, temperature=1.0))
    assert len(roll.texts) == 3 * G
    for row in range(3 * G):
        own = row // G
        m = roll.completion_mask[row:row + 1]
        w = int(m.sum())
        ids = roll.completion_ids[row:row + 1, :w]
        right = _logprobs(policy, batch, [own], ids, m[:, :w])[0]
        wrong = _logprobs(policy, batch, [(own + 1) % 3], ids, m[:, :w])[0]
        sampled = roll.sample_logprobs[row, :w]
        assert (right - sampled).abs().max() < 1e-4
        assert (wrong - sampled).abs().max() > 1e-3
        assert roll.example_of(row).id == mixed_examples[own].id


def test_shared_media_features_equal_per_row_encoding(policy, mixed_examples):
    """Encoding each prompt's images once and sharing them gives the same logprobs and gradients."""
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    rows = [2, 2, 1, 0, 1, 2]                      # G copies of prompts, mixed with a text-only one
    ids, mask = _completions(policy, len(rows), [4, 6, 3, 5, 2, 6])
    inputs, _ = select(batch, rows)
    grads = []
    for shared in (False, True):
        policy.model.zero_grad()
        media = policy.adapter.shared_media(policy.model, batch, rows, policy.device, policy.dtype) \
            if shared else None
        logp, _ = policy.completion_logprobs(inputs, ids, mask, media=media)
        (logp * mask).sum().backward()
        grads.append((logp.detach(), policy.model.model.visual.patch_embed.proj.weight.grad.clone()))
    torch.testing.assert_close(grads[0][0] * mask, grads[1][0] * mask, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-5, rtol=1e-4)
    policy.model.zero_grad()


def shared_prompt_check(policy, batch, rows, ids, mask, grad_of):
    """rollout_logprobs (each distinct prompt once, its cache shared) against whole rows: the
    same logprobs and the same gradients."""
    results = []
    for shared in (False, True):
        policy.model.zero_grad()
        if shared:
            logp, entropy = policy.rollout_logprobs(batch, rows, ids, mask, 0.7, with_entropy=True)
        else:
            inputs, _ = select(batch, rows)
            logp, entropy = policy.completion_logprobs(
                inputs, ids, mask, 0.7, with_entropy=True,
                media=policy.shared_media(batch, rows))
        (logp * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        results.append((logp.detach() * mask, entropy * mask, grads))
    policy.model.zero_grad()
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    torch.testing.assert_close(lp_b, lp_a, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ent_b, ent_a, atol=2e-5, rtol=1e-4)
    assert g_a.keys() == g_b.keys() and grad_of in g_a
    for name, g in g_a.items():
        torch.testing.assert_close(g_b[name], g, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("which", ["qwen2.5-vl", "qwen2-vl"])
def test_a_shared_prompt_gives_the_logprobs_and_gradients_of_whole_rows(
        which, tiny_vl, tiny_qwen2vl, mixed_examples):
    path = tiny_vl if which == "qwen2.5-vl" else tiny_qwen2vl
    policy = Policy.load(ModelConfig(path=str(path)), modalities.get("vision"), torch.device("cpu"))
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    rows = [2, 2, 0, 1, 2, 1, 0]                   # groups of different sizes, out of order
    ids, mask = _completions(policy, len(rows), [5, 9, 2, 7, 3, 9, 1])
    shared_prompt_check(policy, batch, rows, ids, mask, "model.visual.patch_embed.proj.weight")


@pytest.mark.parametrize("which", ["qwen2.5-vl", "qwen2-vl"])
def test_one_prefill_per_prompt_samples_what_g_prefills_sample(which, tiny_vl, tiny_qwen2vl,
                                                               mixed_examples, monkeypatch):
    import mmrlvr.rollout.hf as hf

    path = tiny_vl if which == "qwen2.5-vl" else tiny_qwen2vl
    policy = Policy.load(ModelConfig(path=str(path)), modalities.get("vision"), torch.device("cpu"))
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    params = SamplingParams(n=4, max_new_tokens=12, temperature=1.0)
    runs = []
    for share in (True, False):
        if not share:           # the G-prefill path `num_return_sequences` takes
            monkeypatch.setattr(hf, "prefill_once", lambda m, inputs, kw, n: (inputs, kw))
        torch.manual_seed(3)
        runs.append(make_engine("hf", policy).generate(batch, params))
    shared, whole = runs
    assert torch.equal(shared.completion_ids, whole.completion_ids)
    torch.testing.assert_close(shared.sample_logprobs * shared.completion_mask,
                               whole.sample_logprobs * whole.completion_mask, atol=1e-5, rtol=1e-4)
    prompt_tokens = int(batch.inputs["attention_mask"].sum())
    assert shared.stats["rollout/prefill_tokens"] == prompt_tokens         # each prompt once


def test_chunked_token_logprobs_equal_the_whole_log_softmax(monkeypatch):
    import mmrlvr.train.logprobs as policy_mod

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 10, 50, generator=gen, requires_grad=True)
    ids = torch.randint(0, 50, (3, 10), generator=gen)
    whole = torch.log_softmax(logits.float() / 0.7, dim=-1)
    want = whole.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    want_entropy = -(whole.exp() * whole).sum(-1)
    (g_want,) = torch.autograd.grad(want.sum(), logits)
    monkeypatch.setattr(policy_mod, "LOGPROB_CHUNK", 3 * 50 * 4)     # 4 positions a chunk: 3 chunks
    got, entropy = policy_mod.token_logprobs(logits, ids, 0.7, with_entropy=True)
    (g_got,) = torch.autograd.grad(got.sum(), logits)
    assert torch.equal(got, want) and torch.equal(entropy, want_entropy.detach())
    torch.testing.assert_close(g_got, g_want, atol=0, rtol=1e-6)
