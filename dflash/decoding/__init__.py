"""Lossless speculative decoding: the one loop (`generate`), its verifiers and proposers."""

from dflash.decoding.chain import ChainVerifier
from dflash.decoding.loop import GenerationResult, Verifier, VerifyStep, generate
from dflash.decoding.proposer import BlockProposer, Proposer
from dflash.decoding.sampling import VERIFY_RULES, SamplingConfig
from dflash.decoding.tree import TreeVerifier
from dflash.decoding.verify import Drafts

__all__ = [
    "BlockProposer",
    "ChainVerifier",
    "Drafts",
    "GenerationResult",
    "Proposer",
    "SamplingConfig",
    "TreeVerifier",
    "VERIFY_RULES",
    "Verifier",
    "VerifyStep",
    "generate",
]
