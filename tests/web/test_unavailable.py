"""503 while the engine is not running, through the official client, in-process."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from settings import Settings
from tests.support import SHARED_DATA_DIR
from wiring import build_app


def test_completions_are_503_once_the_engine_stopped(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "storage": {"url": f"sqlite:///{tmp_path / 'bot.db'}"},
            "engine": {"model": "builtin:tiny-qwen3", "data_dir": str(SHARED_DATA_DIR)},
        }
    )
    app = build_app(settings)
    with TestClient(app) as http:
        app.state.chat_manager.engine.shutdown()
        client = OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        with pytest.raises(openai.InternalServerError) as excinfo:
            client.chat.completions.create(model="builtin:tiny-qwen3", messages=[{"role": "user", "content": "hi"}])
    assert excinfo.value.status_code == 503
    assert excinfo.value.code == "model_not_ready"
    assert excinfo.value.response.headers["retry-after"]
