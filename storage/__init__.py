from storage.db import Database
from storage.models import Base, Chat, ChatSession, Message, ProcessedEvent, utcnow
from storage.repositories import ChatRepository, EventRepository, MessageRepository, SessionRepository

__all__ = [
    "Base", "Chat", "ChatRepository", "ChatSession", "Database", "EventRepository", "Message",
    "MessageRepository", "ProcessedEvent", "SessionRepository", "utcnow",
]
