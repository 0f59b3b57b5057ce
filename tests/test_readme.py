"""README promises every environment variable the settings read, with its default."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_variable_the_settings_read_is_in_the_readme() -> None:
    settings = (ROOT / "whalegen" / "config" / "settings.py").read_text()
    names = set(re.findall(r'env(?:str|bool|int|float|list|prices)\(\s*"([A-Z][A-Z0-9_]+)"', settings))
    assert len(names) > 20  # the reader pattern still matches how settings are written
    readme = (ROOT / "README.md").read_text()
    missing = sorted(name for name in names if f"`{name}`" not in readme)
    assert missing == []
