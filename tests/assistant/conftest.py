from tests.chat.chat_support import engine, managers, smollm2_engine  # noqa: F401  (fixtures)
