"""The assistant layer: long-term memory, reminders and scheduled prompts, tools."""
