"""Checks of the weights a model loads: a file cut short is named before loading, and weights
that are NaN or inf are refused after it, naming the file and tensor that hold them.

A truncated `model.safetensors` used to surface as safetensors' own "incomplete metadata, file
not fully covered" traceback from deep inside transformers; NaN weights loaded without a word
and failed the first rollout ("probability tensor contains either inf, nan"). Both raise
`ValueError` here, which `mmrlvr.train.policy.load_model` reports as a PolicyError.

The header check reads each file's header only (bytes, not tensors). The finite check is one
reduction per tensor of the loaded model (a sum is NaN or inf when any element is, and finite
weights cannot sum past float32's range), confirmed element-wise only where it fires.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

HEADER_LIMIT = 100 << 20
"""safetensors' own cap on a header's size."""


def _header_problem(file: Path) -> str | None:
    """Why `file` is not a whole safetensors file, or None."""
    size = file.stat().st_size
    with file.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a header"
        n = int.from_bytes(head, "little")
        if n > min(HEADER_LIMIT, size - 8):
            return f"its header claims {n:,} bytes and the file has {size:,}"
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"its header is not JSON ({err})"
    try:
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
    except (TypeError, KeyError, IndexError, AttributeError):
        return "its header lists no tensor offsets"
    if 8 + n + end > size:
        return f"its header lists {8 + n + end:,} bytes of data and the file has {size:,}"
    return None


def check_weight_files(path: str | Path) -> None:
    """Every `*.safetensors` of a local model dir whole, and every shard its index names there.
    (A hub id is left to transformers, which checks what it downloads.)"""
    root = Path(path)
    if not root.is_dir():
        return
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index} is not a safetensors index ({err}); fetch the model "
                             "again") from None
        missing = sorted(s for s in shards if not (root / s).is_file())
        if missing:
            raise ValueError(f"{index} names {len(missing)} weight file(s) that are not in "
                             f"{root}: {', '.join(missing[:3])}; fetch the model again")
    for file in sorted(root.glob("*.safetensors")):
        why = _header_problem(file)
        if why:
            raise ValueError(f"{file} is not a whole safetensors file ({why}): it was cut short "
                             "or corrupted by a download or copy; fetch or copy it again")


def _bad_in_files(root: Path, limit: int = 3) -> list[str]:
    """The tensors of `root`'s safetensors files holding NaN or inf: "file: tensor (n of m)"."""
    from safetensors import safe_open

    found = []
    for file in sorted(root.glob("*.safetensors")) if root.is_dir() else []:
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():
                t = fh.get_tensor(key)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad = int((~torch.isfinite(t)).sum())
                    found.append(f"{file}: tensor {key!r} ({bad:,} of {t.numel():,} values)")
                    if len(found) >= limit:
                        return found
    return found


def check_finite(model: torch.nn.Module, path: str | Path) -> None:
    """Refuse a loaded model with NaN or inf weights, naming the files and tensors."""
    bad = []
    for name, p in model.named_parameters():
        if p.is_floating_point() and not math.isfinite(float(p.detach().sum())) \
                and not bool(torch.isfinite(p.detach()).all()):
            bad.append(name)
    if not bad:
        return
    where = _bad_in_files(Path(path)) or [f"parameter {name!r}" for name in bad[:3]]
    more = f" (and {len(bad) - len(where)} more tensors)" if len(bad) > len(where) else ""
    raise ValueError(f"its weights hold NaN or inf values: {'; '.join(where)}{more}. A model "
                     "with non-finite weights samples garbage and learns nothing: fetch or "
                     "export it again, or resume from an earlier checkpoint")
