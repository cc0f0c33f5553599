"""Lossless speculative decoding with DFlash drafters."""

from dflash.decoding.engine import GenerationResult, generate
from dflash.decoding.proposer import DFlashProposer, Proposer, TokenProposer
from dflash.decoding.sampling import VERIFY_RULES, SamplingConfig
from dflash.decoding.verify import Drafts

__all__ = [
    "DFlashProposer", "Drafts", "GenerationResult", "Proposer", "SamplingConfig", "TokenProposer", "VERIFY_RULES", "generate",
]
