"""Typed readers for environment variables.

Settings come from the environment only. Each helper fails loudly on a value it cannot parse, because
a typo in `WHALEGEN_CYCLE_INTERVAL_S=1O` silently falling back to a default is worse than a crash at
start-up. Secrets may come from `<NAME>_FILE` (Docker/Kubernetes secrets mount a file).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit


class ConfigError(RuntimeError):
    """An environment variable is missing or malformed."""


def envstr(name: str, default: str | None = None) -> str | None:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value


def envbool(name: str, default: bool) -> bool:
    value = envstr(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean (use true/false, 1/0, yes/no, on/off)")


def envint(name: str, default: int) -> int:
    value = envstr(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{name}={value!r} is not an integer") from exc


def envfloat(name: str, default: float) -> float:
    value = envstr(name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ConfigError(f"{name}={value!r} is not a number") from exc


def envlist(name: str, default: list[str]) -> list[str]:
    value = envstr(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def database_from_url(url: str) -> dict[str, object]:
    """Turn `postgres://user:pass@host:5432/name?sslmode=require` or `sqlite:///path` into DATABASES[...]."""
    parts = urlsplit(url)
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ConfigError(f"DATABASE_URL {url!r} names no database")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
            # Persistent connections: the web tier and workers issue many short queries.
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        # The path after the empty netloc keeps one leading slash too many:
        # sqlite:////abs/path → "//abs/path" (absolute), sqlite:///rel → "/rel" (relative).
        if path.startswith("/"):
            path = path[1:]
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path or ":memory:"}
    raise ConfigError(f"DATABASE_URL scheme {parts.scheme!r} is not supported (use postgres:// or sqlite://)")


def envprices(name: str) -> dict[str, float]:
    """`MODEL=PRICE,MODEL=PRICE` → {canonical model name: price}; an unknown model or a bad price stops
    the process at start rather than pricing a report wrongly later."""
    from whalegen.gpus.catalogue import canonical_model_name

    prices: dict[str, float] = {}
    for item in (envstr(name, "") or "").split(","):
        if not item.strip():
            continue
        model, sep, price = item.partition("=")
        try:
            value = float(price)
            model_name = canonical_model_name(model.strip())
        except (ValueError, LookupError) as exc:
            raise ConfigError(f"{name}: {item.strip()!r} is not MODEL=PRICE with a catalogue model") from exc
        if not sep or value < 0:
            raise ConfigError(f"{name}: {item.strip()!r} is not MODEL=PRICE with a price of 0 or more")
        prices[model_name] = value
    return prices
