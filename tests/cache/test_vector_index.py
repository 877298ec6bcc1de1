import numpy as np

from cache.index import VectorIndex


def unit_vectors(count: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_flat_search_and_remove() -> None:
    index = VectorIndex(dim=16, approx_min_entries=1000, nprobe=4)
    vectors = unit_vectors(10, 16, seed=0)
    index.add(list(range(100, 110)), vectors)
    assert index.search(vectors[3], k=1) == [(103, index.search(vectors[3], k=1)[0][1])]
    assert abs(index.search(vectors[3], k=1)[0][1] - 1.0) < 1e-5
    index.remove([103])
    assert 103 not in [i for i, _ in index.search(vectors[3], k=10)] and len(index) == 9
    assert len(index.search(vectors[0], k=50)) == 9


def test_turns_approximate_past_the_size_and_still_finds_near_duplicates() -> None:
    index = VectorIndex(dim=32, approx_min_entries=2000, nprobe=8)
    vectors = unit_vectors(3000, 32, seed=1)
    index.add(list(range(1500)), vectors[:1500])
    assert not index.approximate
    index.add(list(range(1500, 3000)), vectors[1500:])
    assert index.approximate and len(index) == 3000
    queries = vectors[::100] + 0.01 * unit_vectors(30, 32, seed=2)
    found = [index.search(q / np.linalg.norm(q), k=1)[0][0] for q in queries]
    assert found == list(range(0, 3000, 100))
    index.remove([0])
    assert index.search(vectors[0], k=1)[0][0] != 0
