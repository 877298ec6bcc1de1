"""Reading the settings: config.yaml, then secrets from the environment, validated by pydantic.
Any problem is one line naming the file, the key and what is wrong."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from settings.sections import Settings

# Secrets read from the environment, overriding the file: variable -> dotted key.
SECRET_ENV: dict[str, str] = {
    "FEISHU_APP_ID": "feishu.app_id",
    "FEISHU_APP_SECRET": "feishu.app_secret",
    "FEISHU_VERIFICATION_TOKEN": "feishu.verification_token",
    "FEISHU_ENCRYPT_KEY": "feishu.encrypt_key",
    "CLAWDBOT_ADMIN_TOKEN": "admin.token",
    "CLAWDBOT_API_KEY": "api.key",
    "CLAWDBOT_ENGINE_API_KEY": "engine.remote_api_key",
}


class ConfigError(Exception):
    """One line naming the file, the key and the problem."""


def load_settings(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read `path` (None: defaults only), apply secrets from the environment, validate."""
    environ = os.environ if environ is None else environ
    source = str(path) if path is not None else "defaults"
    data = _read_yaml(path) if path is not None else {}
    for variable, dotted in SECRET_ENV.items():
        if environ.get(variable):
            _set_dotted(data, dotted, environ[variable])
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc.errors()[0])}") from None


def anchored(settings: Settings, folder: Path) -> Settings:
    """The settings with their relative paths (`engine.data_dir`, a SQLite `storage.url`) taken
    from `folder`, the config file's, not from wherever the app happens to be started: started
    from elsewhere, it would silently create a fresh database and fetch the model again there."""
    engine = settings.engine.model_copy(update={"data_dir": str(folder / settings.engine.data_dir)})
    storage = settings.storage
    # sqlite:///relative/path, sqlite:////absolute/path (read without SQLAlchemy: importing it
    # would cost the port's first answer a quarter of a second)
    scheme, separator, database = storage.url.partition(":///")
    if scheme.split("+")[0] == "sqlite" and separator and database and not database.startswith(("/", ":memory:")):
        storage = storage.model_copy(update={"url": f"{scheme}:///{folder / database}"})
    return settings.model_copy(update={"engine": engine, "storage": storage})


def _read_yaml(path: str | Path) -> dict[str, Any]:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{name}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a mapping of sections at the top level")
    return data


def _set_dotted(data: dict[str, Any], dotted: str, value: str) -> None:
    *sections, key = dotted.split(".")
    for section in sections:
        data = data.setdefault(section, {})
    data[key] = value


_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "dict_type": "a mapping",
}
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _describe(error: ErrorDetails) -> str:
    key = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    got = json.dumps(error.get("input"), ensure_ascii=False, default=str)
    if kind == "extra_forbidden":
        return f"{key}: unknown key"
    if kind == "literal_error":
        return f"{key}: expected one of {error['ctx']['expected']}, got {got}"
    if kind in _EXPECTED or kind in _RANGE_ERRORS:
        path, field = _field(error["loc"])
        expected = _EXPECTED.get(kind) or (
            "an integer" if int in (field.annotation, *get_args(field.annotation)) else "a number"
        )
        return f"{path}: expected {expected}{_range_text(field)}, got {got}"
    return f"{key}: {error['msg']}, got {got}"


def _field(loc: tuple[int | str, ...]) -> tuple[str, FieldInfo]:
    """The dotted key and the field an error's location names; an optional field's error
    location goes on to name the type it tried (`engine.max_model_len.int`)."""
    model: type[BaseModel] = Settings
    path: list[str] = []
    for part in loc:
        if not isinstance(part, str) or part not in model.model_fields:
            break
        path.append(part)
        field = model.model_fields[part]
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            model = field.annotation
    return ".".join(path), field


def _range_text(field: FieldInfo) -> str:
    """ " 1-65535" for an inclusive range, else each bound: " > 0 and <= 1"."""
    ge = next((b.ge for b in field.metadata if isinstance(b, Ge)), None)
    le = next((b.le for b in field.metadata if isinstance(b, Le)), None)
    if ge is not None and le is not None:
        return f" {ge}-{le}"
    parts = []
    for bound in field.metadata:
        if isinstance(bound, Ge):
            parts.append(f">= {bound.ge}")
        elif isinstance(bound, Gt):
            parts.append(f"> {bound.gt}")
        elif isinstance(bound, Le):
            parts.append(f"<= {bound.le}")
        elif isinstance(bound, Lt):
            parts.append(f"< {bound.lt}")
    return " " + " and ".join(parts) if parts else ""
