"""Django for an operator's command run on the plane itself (`token create --user`, `create join-token`,
`delete`, `approve`, `apply --local`): the plane's settings, database and logging, in this process."""

from __future__ import annotations

import os
import sys
from typing import TextIO


def plane_setup(stream: TextIO | None = None) -> None:
    """Set Django up with the plane's settings. At a terminal (`stream`, stderr by default) the log lines
    are plain, as `whalegen demo`'s are: the command prints its own sentence, and a JSON object beside it
    ("cli:root made join token …") reads as noise. Piped, or in a container (the compose stack's one-shot
    bootstrap), they stay JSON; an explicit WHALEGEN_LOG_FORMAT always wins."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    if (stream or sys.stderr).isatty():
        os.environ.setdefault("WHALEGEN_LOG_FORMAT", "plain")
    import django

    django.setup()
