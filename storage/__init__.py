from storage.db import Database
from storage.models import Base, CacheEntry, Chat, ChatSession, Message, ProcessedEvent, utcnow
from storage.repositories import CacheRepository, ChatRepository, EventRepository, MessageRepository, SessionRepository

__all__ = [
    "Base",
    "CacheEntry",
    "CacheRepository",
    "Chat",
    "ChatRepository",
    "ChatSession",
    "Database",
    "EventRepository",
    "Message",
    "MessageRepository",
    "ProcessedEvent",
    "SessionRepository",
    "utcnow",
]
