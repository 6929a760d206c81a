"""Shared fixtures: tiny real-architecture models and a small shapes dataset, built once."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per process: the suite runs two pytest workers on two cores and many tests
# start runs of their own, so torch's default (a thread per core in every process) oversubscribes
# the cores and its OpenMP threads spin waiting for each other. Measured on 2 cores: three test
# files took 58 s with the default and 22-28 s with one thread. The runs the tests start inherit
# it; a test that sets `train.threads` still gets what it asks for.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_configure(config):
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory):
    from mmrlvr.tasks.shapes import make_shapes

    out = tmp_path_factory.mktemp("shapes")
    make_shapes(out, n_train=96, n_test=24, seed=0, image_size=56)
    return out


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory):
    """A tiny Qwen2.5-VL model dir (random weights, real classes)."""
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2.5-vl", tmp_path_factory.mktemp("tiny-qwen25vl"))


@pytest.fixture(scope="session")
def tiny_qwen2vl(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2-vl", tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """`tiny_dirs(kind)`: a tiny model dir of any `mmrlvr tiny` kind, built once per session."""
    from mmrlvr.tiny import build_tiny

    made = {}

    def get(kind: str):
        if kind not in made:
            made[kind] = build_tiny(kind, tmp_path_factory.mktemp(kind.replace(".", "")))
        return made[kind]
    return get


@pytest.fixture(scope="session")
def policy(tiny_vl):
    """A loaded Policy on CPU for the tiny Qwen2.5-VL."""
    import torch

    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.train.policy import Policy

    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(tiny_vl)), modalities.get("vision"), torch.device("cpu"))
