"""DFlash, the block drafter this project trains: its training objective (objective),
confidence-adaptive drafts (adaptive) and its proposer for the decoding loop (proposer).
The drafter model itself is `dflash.drafter` (shared with EAGLE-3's layers and the loaders)."""
