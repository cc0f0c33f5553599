"""Lossless speculative decoding: the one loop (`generate`), its verifiers and proposers.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

from dflash import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "dflash.decoding.chain": ["ChainVerifier"],
        "dflash.decoding.loop": ["GenerationResult", "Verifier", "VerifyStep", "generate"],
        "dflash.decoding.proposer": ["BlockProposer", "Proposer"],
        "dflash.decoding.sampling": ["VERIFY_RULES", "SamplingConfig"],
        "dflash.decoding.tree": ["TreeVerifier"],
        "dflash.decoding.verify": ["Drafts"],
    },
)
