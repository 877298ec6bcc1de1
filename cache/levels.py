"""How a turn's answer was found: the X-Cache-Status header, the figures' and the metrics' labels."""

from enum import StrEnum


class CacheLevel(StrEnum):
    MISS = "miss"  # the model wrote it
    EXACT = "exact"  # L1: the same normalized question, asked in the same scope
    SEMANTIC = "semantic"  # L2: a verified paraphrase of a cached question
    MERGED = "merged"  # shared with an identical request that was generating at the same time
