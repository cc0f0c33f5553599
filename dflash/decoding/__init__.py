"""Lossless speculative decoding: the one loop (`generate`), its verifiers and proposers.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

import importlib

_EXPORTS = {
    "dflash.decoding.chain": ["ChainVerifier"],
    "dflash.decoding.loop": ["GenerationResult", "Verifier", "VerifyStep", "generate"],
    "dflash.decoding.proposer": ["BlockProposer", "Proposer"],
    "dflash.decoding.sampling": ["VERIFY_RULES", "SamplingConfig"],
    "dflash.decoding.tree": ["TreeVerifier"],
    "dflash.decoding.verify": ["Drafts"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'dflash.decoding' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
