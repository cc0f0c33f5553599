"""DSpark (arXiv 2607.05147): the DFlash drafter with a Markov head and a confidence head
(`dflash.drafter.heads`); its proposer and its training objective."""
