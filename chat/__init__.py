"""The turn pipeline: sessions and their token histories, compression, request merging, and the
ChatManager that runs a turn from the user's text to the stored reply."""

from chat.manager import ChatManager
from chat.sessions import Conversation, SessionStore
from chat.transcripts import ChatMessage, Transcript
from chat.turns import InvalidMessage, Turn, TurnResult
from engine.remote import EngineUnavailable  # what a turn fails with while the model server is unreachable

__all__ = [
    "ChatManager",
    "ChatMessage",
    "Conversation",
    "EngineUnavailable",
    "InvalidMessage",
    "SessionStore",
    "Transcript",
    "Turn",
    "TurnResult",
]
