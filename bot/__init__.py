"""The Feishu/Lark bot: transport, event policy, commands and streamed replies, on lark-oapi."""

from bot.feishu_bot import FeishuBot

__all__ = ["FeishuBot"]
