"""The vLLM weight sync gathers a (sharded) model unit by unit, without vLLM or a GPU: counted
fake shards (one unit's tensors alive at a time, every shard once, in model order, the same on
every rank) and real FSDP2 over 2 gloo processes (the shards sync exactly like the whole model),
a MoE model's fused experts cut per expert (or sent transposed) inside their layer's unit.
Weight names and the LoRA merge: test_vllm_names.py; the engine: test_vllm_engine.py."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from mmrlvr.rollout.vllm_sync import load_units, sync_units, unit_key
from tests.vllm_helpers import load, synced, with_lora


# ------------------------------------------------------------------------------- unit by unit

class GatherLog:
    """Counts `full_tensor()` calls and checks that no tensor of an earlier unit is still alive."""

    def __init__(self):
        self.order: list[str] = []
        self.unit = -1
        self.unit_name = None
        self.alive: list[tuple[weakref.ref, int]] = []
        self.most_alive = 0

    def gathering(self, name: str) -> None:
        key = unit_key(name)
        if key != self.unit_name:
            self.unit, self.unit_name = self.unit + 1, key
        live = [(ref, u) for ref, u in self.alive if ref() is not None]
        stale = [u for _, u in live if u != self.unit]
        assert not stale, f"gathering {name} (unit {self.unit}) while tensors of units {stale} live"
        self.order.append(name)

    def track(self, tensor: torch.Tensor) -> None:
        self.alive.append((weakref.ref(tensor), self.unit))
        self.most_alive = max(self.most_alive, sum(r() is not None for r, _ in self.alive))


class FakeShard:
    """A DTensor stand-in: `full_tensor()` hands out a fresh whole tensor and is logged."""

    def __init__(self, name, value, requires_grad, log):
        self.name, self.value, self.requires_grad, self.log = name, value, requires_grad, log

    def full_tensor(self) -> torch.Tensor:
        self.log.gathering(self.name)
        whole = self.value.clone()
        self.log.track(whole)
        return whole


class ShardedModel:
    """What sync_units reads of a model, with every parameter a FakeShard."""

    def __init__(self, model, log):
        self._params = [(n, FakeShard(n, p.detach(), p.requires_grad, log))
                        for n, p in model.named_parameters()]
        self._model = model

    def named_parameters(self):
        return iter(self._params)

    def named_modules(self):
        return self._model.named_modules()


def test_units_are_gathered_one_at_a_time_in_a_fixed_order(tiny_qwen2vl):
    peft_model = with_lora(load(tiny_qwen2vl))
    want = synced(peft_model, "qwen2_vl", torch.bfloat16)
    logs, results = [], []
    for _ in range(2):                                   # two "ranks"
        log = GatherLog()
        received: dict[str, torch.Tensor] = {}

        def load_fn(unit, log=log, received=received):
            for name, tensor in unit:
                log.track(tensor)
                received[name] = tensor.clone()          # a copy: vLLM copies into its own

        count, size = load_units(sync_units(ShardedModel(peft_model, log), "qwen2_vl",
                                            torch.bfloat16), load_fn)
        assert count == len(received) and size == 2 * sum(t.numel() for t in received.values())
        logs.append(log)
        results.append(received)
    params = [n for n, _ in peft_model.named_parameters()]
    active_lora = [n for n in params if "lora_" in n]
    assert logs[0].order == logs[1].order == params      # every shard, model order, once
    assert active_lora and set(active_lora) <= set(logs[0].order)
    layer_size = sum(1 for n in params if ".language_model.layers.0." in n)
    assert logs[0].most_alive <= 2 * layer_size          # one layer: whole + cast copies
    for got in results:
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]) and got[name].dtype == torch.bfloat16


MOE_KINDS = {"qwen3.5-moe": "qwen3_5_moe", "qwen3-vl-moe": "qwen3_vl_moe"}


@pytest.mark.parametrize("kind", list(MOE_KINDS))
def test_fused_experts_are_sent_inside_their_layers_unit(tiny_dirs, kind):
    """Cut per expert (Qwen3.5-MoE) or transposed whole (Qwen3-VL-MoE): every fused shard is
    gathered once, and what it becomes goes with the rest of its decoder layer."""
    model_type = MOE_KINDS[kind]
    model = load(tiny_dirs(kind))
    want = synced(model, model_type, torch.bfloat16)
    log = GatherLog()
    units: list[list[str]] = []
    received: dict[str, torch.Tensor] = {}

    def load_fn(unit):
        units.append([name for name, _ in unit])
        for name, tensor in unit:
            log.track(tensor)
            received[name] = tensor.clone()

    load_units(sync_units(ShardedModel(model, log), model_type, torch.bfloat16), load_fn)
    assert log.order == [n for n, _ in model.named_parameters()]     # each fused shard once
    assert received.keys() == want.keys()
    assert all(torch.equal(received[k], want[k]) for k in want)
    text = model.config.text_config
    with_experts = [u for u in units if any(".experts." in n for n in u)]
    assert len(with_experts) == text.num_hidden_layers
    for unit in with_experts:                                         # one layer, all its experts
        assert len({re.search(r"\.layers\.(\d+)\.", n).group(1) for n in unit}) == 1
        per_layer = 3 * text.num_experts if kind == "qwen3.5-moe" else 2
        assert sum(".mlp.experts." in n for n in unit) == per_layer


FSDP_SCRIPT_MARK = "--fsdp2-worker"


FSDP_VARIANTS = {"plain": "qwen2_vl", "lora": "qwen2_vl", "moe": "qwen3_5_moe",
                 "vl-moe": "qwen3_vl_moe"}
"""Each variant's model type: a tiny Qwen2-VL (plain, then with LoRA), a tiny Qwen3.5-MoE (its
fused experts cut per expert) and a tiny Qwen3-VL-MoE (its fused experts sent transposed)."""


def fsdp2_worker(paths: dict[str, str], out: str) -> None:
    """One rank: sync units of each variant's model (`paths`: model type -> tiny model dir)
    before and after fully_shard on the training's units, and write whether they match."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from mmrlvr import models
    from mmrlvr.train.parallel import shard_units

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    result = {}
    for variant, model_type in FSDP_VARIANTS.items():
        model = load(paths[model_type])
        if variant == "lora":
            model = with_lora(model)
        want = synced(model, model_type, torch.bfloat16)
        for unit in shard_units(model, models.of_type(model_type)):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sharded = all(isinstance(p, DTensor) for p in model.parameters())
        got = synced(model, model_type, torch.bfloat16)
        result[variant] = {"sharded": sharded, "names": list(got),
                           "equal": got.keys() == want.keys()
                           and all(torch.equal(got[k], want[k]) for k in want)}
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_shards_sync_exactly_like_the_whole_model_on_two_processes(tiny_qwen2vl, tiny_dirs,
                                                                         tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    paths = json.dumps({"qwen2_vl": str(tiny_qwen2vl), "qwen3_5_moe": str(tiny_dirs("qwen3.5-moe")),
                        "qwen3_vl_moe": str(tiny_dirs("qwen3-vl-moe"))})
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                              os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen(
            [sys.executable, __file__, FSDP_SCRIPT_MARK, paths, str(tmp_path / f"rank{rank}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for variant in FSDP_VARIANTS:
        assert all(r[variant]["sharded"] and r[variant]["equal"] for r in ranks), variant
        assert ranks[0][variant]["names"] == ranks[1][variant]["names"]


if __name__ == "__main__" and sys.argv[1:2] == [FSDP_SCRIPT_MARK]:
    fsdp2_worker(json.loads(sys.argv[2]), sys.argv[3])
