import numpy as np
import pytest

from cache.embeddings import Embedder


@pytest.mark.parametrize("name", ["embedder", "minilm"])
def test_batched_normalized_float32(name: str, request: pytest.FixtureRequest) -> None:
    embedder: Embedder = request.getfixturevalue(name)
    texts = ["How do I reset my password?", "How can I reset my password", "What is the capital of France?"]
    vectors = embedder.encode(texts)
    assert vectors.shape == (3, embedder.dim) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert embedder.encode([]).shape == (0, embedder.dim)


def test_e5_separates_chinese_paraphrases_from_unrelated_questions(embedder: Embedder) -> None:
    a, paraphrase, unrelated = embedder.encode(["如何重置密码", "密码怎么重置", "今天股市怎么样"])
    assert a @ paraphrase > 0.93 > 0.86 > a @ unrelated
