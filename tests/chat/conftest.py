from chat_support import embedder, engine, managers, tokenizer  # noqa: F401  (fixtures)
