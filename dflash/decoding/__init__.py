"""Lossless speculative decoding with DFlash drafters."""

from dflash.decoding.engine import ChainVerifier, generate
from dflash.decoding.loop import GenerationResult, Verifier, VerifyStep
from dflash.decoding.proposer import Proposer, TokenProposer
from dflash.decoding.sampling import VERIFY_RULES, SamplingConfig
from dflash.decoding.verify import Drafts

__all__ = [
    "ChainVerifier",
    "Drafts",
    "GenerationResult",
    "Proposer",
    "SamplingConfig",
    "TokenProposer",
    "VERIFY_RULES",
    "Verifier",
    "VerifyStep",
    "generate",
]
