from tests.chat.chat_support import engine, managers  # noqa: F401  (fixtures)
