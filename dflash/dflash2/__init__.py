"""DFlash2 (z-lab and Inco AI): the DFlash drafter with block-local convolutions in its layers and
a top-k candidate selector (`dflash.drafter.heads`); its proposer and objective."""
