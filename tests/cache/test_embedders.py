import numpy as np
import pytest

from cache.embeddings import CachedEmbedder, Embedder


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


def test_cached_embedder_embeds_a_text_once_and_keeps_the_newest(embedder: Embedder) -> None:
    asked: list[list[str]] = []

    class Counting:
        """The real embedder, noting what it is asked."""

        name, dim = embedder.name, embedder.dim

        def encode(self, texts: list[str]) -> np.ndarray:
            asked.append(list(texts))
            return embedder.encode(texts)

    cached = CachedEmbedder(Counting(), capacity=2)
    vectors = cached.encode(["年假怎么申请", "VPN 连不上", "年假怎么申请"])
    assert asked == [["年假怎么申请", "VPN 连不上"]]
    assert np.allclose(vectors, embedder.encode(["年假怎么申请", "VPN 连不上", "年假怎么申请"]), atol=1e-6)
    cached.encode(["VPN 连不上", "打印机怎么连接"])
    assert asked[-1] == ["打印机怎么连接"]  # the two newest stay: the first question left
    cached.encode(["年假怎么申请"])
    assert asked[-1] == ["年假怎么申请"]
