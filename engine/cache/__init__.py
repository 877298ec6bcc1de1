"""The response cache: answers repeated and paraphrased questions without running the model."""

from engine.cache.config import CALIBRATED_THRESHOLDS, CacheConfig, EvictionWeights
from engine.cache.keys import Scope, l1_key, normalize, scope_key
from engine.cache.response_cache import CacheHit, EntryView, Judge, ResponseCache
from engine.cache.verify import Verdict, verify

__all__ = [
    "CALIBRATED_THRESHOLDS", "CacheConfig", "CacheHit", "EntryView", "EvictionWeights", "Judge", "ResponseCache",
    "Scope", "Verdict", "l1_key", "normalize", "scope_key", "verify",
]
