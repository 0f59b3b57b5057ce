"""The API's only body parser: JSON, refused with a 400 before it reaches a serializer when PostgreSQL
could not store it or Python could not walk it.

- NUL (U+0000) cannot be stored in a PostgreSQL text or jsonb value, and a lone surrogate (U+D800–
  U+DFFF, which JSON's `\\ud800` escape produces) cannot be encoded as UTF-8: either would be a 500 at
  INSERT time, so the request is refused here, naming where the character is.
- Nesting deeper than the interpreter's recursion limit (100k levels of `[`) makes the decoder raise
  RecursionError; that is bad input, not a server error. Shallower nesting is refused by the fields.
- NaN and Infinity are not JSON; Python's decoder accepts them unless told not to.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
# In valid JSON text both can only arrive as \u escapes (raw control characters are refused by the
# decoder, raw surrogates by UTF-8): bodies without such an escape skip the walk.
_BAD_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
BAD_CHAR_MESSAGE = "strings may not hold NUL (U+0000) or an unpaired surrogate"


def bad_string_at(value: Any) -> str | None:
    """The path of the first string (key or value) holding NUL or a lone surrogate; None if none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _BAD_CHAR.search(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{key!s}" if path else str(key)
                if _BAD_CHAR.search(key):
                    return f"{path or 'body'} (a key)"
                stack.append((where, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{index}]", child) for index, child in enumerate(item))
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"the body is not valid {encoding}: {exc.reason} at byte {exc.start}") from exc
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply") from exc
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        if _BAD_ESCAPE.search(text):
            where = bad_string_at(data)
            if where is not None:
                raise ParseError(f"{where}: {BAD_CHAR_MESSAGE}")
        return data
