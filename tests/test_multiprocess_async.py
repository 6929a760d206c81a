"""One-step-off rollouts under FSDP2 with 2 real gloo processes: the behaviour copy is a whole
model on each rank, taken before sharding, and each snapshot all-gathers the trained weights
into it, so the batch generated ahead for step 2 comes from the weights update 1 made, on every
rank, while the sharded update runs on the main thread."""
from __future__ import annotations

import json

from tests.test_multiprocess import env, run_ok, torchrun, write_config

SCRIPT = '''
import json, os, sys
import torch
from mmrlvr.config import load_config
from mmrlvr.train.setup import build_run
from mmrlvr.train.trainer import grpo_step

run = build_run(load_config(sys.argv[1], []))[0]


def whole(model):        # every rank calls it: full_tensor all-gathers each sharded weight
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters() if p.requires_grad}


w0 = whole(run.policy.model)
first = grpo_step(run, 1)                       # generated now; step 2's batch starts meanwhile
w1 = whole(run.policy.model)
second = grpo_step(run, 2)                      # snapshot of w1 taken before update 2 ran
copy = dict(run.prefetch.copy.named_parameters())
sharded = [n for n, p in run.policy.model.named_parameters() if hasattr(p, "full_tensor")]
out = {"stale": [first["async/stale"], second["async/stale"]],
       "grad_norm": [first["optim/grad_norm"], second["optim/grad_norm"]],
       "copy_is_w1": all(torch.equal(copy[n].float(), w1[n].float()) for n in w1),
       "copy_is_w0": all(torch.equal(copy[n].float(), w0[n].float()) for n in w0),
       "update_1_moved": any(not torch.equal(w0[n], w1[n]) for n in w0),
       "copy_sharded": any(hasattr(p, "full_tensor") for p in run.prefetch.copy.parameters()),
       "live_sharded": len(sharded), "checksum": float(sum(v.double().sum() for v in w1.values()))}
with open(sys.argv[2] + "." + os.environ["RANK"], "w") as fh:
    json.dump(out, fh)
'''


def test_one_step_off_under_fsdp2_generates_ahead_from_the_gathered_weights(tmp_path, tiny_vl,
                                                                            shapes_dir):
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "fsdp2-async",
                       train={"steps": 3, "strategy": "fsdp2", "async_rollouts": "one_step_off",
                              "threads": 1, "eval_every": 0}, data={"eval": ""})
    script = tmp_path / "two_steps.py"
    script.write_text(SCRIPT)
    run_ok(torchrun(str(script), str(cfg), str(tmp_path / "out")),
           env=env(MMRLVR_TRACE=str(tmp_path / "trace")))
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in (0, 1)]
    for got in ranks:
        assert got["live_sharded"] > 0 and not got["copy_sharded"]      # FSDP2, a whole copy
        assert got["stale"] == [0.0, 1.0]              # step 2 trained on the batch made ahead
        assert all(g > 0 for g in got["grad_norm"])
        assert got["update_1_moved"] and got["copy_is_w1"] and not got["copy_is_w0"]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]           # the ranks hold one model
