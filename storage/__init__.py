from storage.db import Database, ProcessLocks
from storage.models import Base, CacheEntry, Chat, ChatSession, FollowedThread, Memory, Message, ProcessedEvent, utcnow
from storage.repositories import (
    CacheRepository,
    ChatRepository,
    EventRepository,
    MessageRepository,
    NewMessage,
    SessionQuery,
    SessionRepository,
    ThreadRepository,
)

__all__ = [
    "Base",
    "CacheEntry",
    "CacheRepository",
    "Chat",
    "ChatRepository",
    "ChatSession",
    "Database",
    "EventRepository",
    "FollowedThread",
    "Memory",
    "Message",
    "MessageRepository",
    "NewMessage",
    "ProcessLocks",
    "ProcessedEvent",
    "SessionQuery",
    "SessionRepository",
    "ThreadRepository",
    "utcnow",
]
