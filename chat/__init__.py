"""The turn pipeline: sessions and their token histories, compression, request merging, and the
ChatManager that runs a turn from the user's text to the stored reply."""

from chat.manager import ChatManager
from chat.sessions import Conversation, SessionStore
from chat.transcripts import ChatMessage, Transcript
from chat.turns import InvalidMessage, Turn, TurnResult

__all__ = [
    "ChatManager",
    "ChatMessage",
    "Conversation",
    "InvalidMessage",
    "SessionStore",
    "Transcript",
    "Turn",
    "TurnResult",
]
