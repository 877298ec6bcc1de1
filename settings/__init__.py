"""The typed settings: one section per part, read from config.yaml and the environment."""

from settings.loading import SECRET_ENV, ConfigError, anchored, load_settings
from settings.sections import (
    AdminSettings,
    ApiSettings,
    AssistantSettings,
    CacheSettings,
    ContextSettings,
    EngineSettings,
    FeishuSettings,
    GenerationSettings,
    LimitsSettings,
    LoggingSettings,
    MaintenanceSettings,
    ServerSettings,
    SessionSettings,
    Settings,
    StorageSettings,
)

__all__ = [
    "SECRET_ENV",
    "AdminSettings",
    "ApiSettings",
    "AssistantSettings",
    "CacheSettings",
    "ConfigError",
    "ContextSettings",
    "EngineSettings",
    "FeishuSettings",
    "GenerationSettings",
    "LimitsSettings",
    "LoggingSettings",
    "MaintenanceSettings",
    "ServerSettings",
    "SessionSettings",
    "Settings",
    "StorageSettings",
    "anchored",
    "load_settings",
]
