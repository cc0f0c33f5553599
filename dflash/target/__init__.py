"""The frozen target model and its helpers."""

from dflash.target.cache import cache_length, crop_cache
from dflash.target.model import TargetModel, TargetOutput, extract_features

__all__ = ["TargetModel", "TargetOutput", "cache_length", "crop_cache", "extract_features"]
