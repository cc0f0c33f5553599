"""Lossless speculative decoding with DFlash drafters."""

from dflash.decoding.engine import GenerationResult, generate
from dflash.decoding.proposer import DFlashProposer, Proposer
from dflash.decoding.sampling import VERIFY_RULES, SamplingConfig

__all__ = ["DFlashProposer", "GenerationResult", "Proposer", "SamplingConfig", "VERIFY_RULES", "generate"]
