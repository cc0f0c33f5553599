"""Fixtures shared by every test folder: tiny random targets of two architectures.

Doubles and helper functions are not fixtures: they live in tests/helpers/ (`import helpers`)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from dflash.engine import native
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target

ARCHS = ["qwen3", "llama"]

# Tiny models at batch 1 gain nothing from intra-op threads, and on a loaded 2-core
# machine spinning threads make them 10-30x slower.
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """The end-to-end files first (a stable sort): under `--dist loadfile --no-loadscope-reorder`
    (the Makefile's) workers take whole files in this order, so the long files start early and
    the short ones even out the workers' ends."""
    items.sort(key=lambda item: item.path.parent.name != "e2e")


@pytest.fixture(scope="session", params=ARCHS)
def tiny_target(request) -> TargetModel:
    """A random tiny target (Qwen3 and Llama architectures), byte tokenizer."""
    model, tokenizer = build_tiny_target(request.param, seed=0)
    return TargetModel(model, tokenizer)


@pytest.fixture(scope="session")
def qwen3_target() -> TargetModel:
    model, tokenizer = build_tiny_target("qwen3", seed=0)
    return TargetModel(model, tokenizer)


@pytest.fixture(params=native.cpu_isas() or [None])
def kernel_isa(request, monkeypatch) -> str:
    """Each instruction set of our kernels that this CPU runs (csrc/vec.h: an AVX-512 CPU runs
    the AVX2 build too), as this process's kernels for the test. A build that fails fails the
    test; only a CPU with none of them, or a machine without a C++ compiler, skips."""
    isa = request.param
    if isa is None:
        pytest.skip("this CPU runs none of our kernels' instruction sets (AVX2, AVX-512, NEON)")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    assert native.build(isa) is not None, f"our {isa} kernels did not build here"
    monkeypatch.setenv(native.ISA_ENV, isa)
    native.module.cache_clear()
    yield isa
    native.module.cache_clear()
