#!/usr/bin/env python
import logging
import os
import sys

# The steps a supervisor or the compose stack runs before the plane starts (docs/operations.md): their
# output is read by the same log pipeline as the processes', so it is log lines too
# (docs/logs-and-metrics.md, "Logs"). Other commands print data (`issue_node_token` prints a credential,
# `dumpdata` rows): their output stays theirs.
START_UP_COMMANDS = frozenset({"migrate", "check", "collectstatic"})


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    from django.core.management import execute_from_command_line

    if sys.argv[1:2] and sys.argv[1] in START_UP_COMMANDS:
        from whalegen.logformat import structured_stdio

        with structured_stdio(f"manage.{sys.argv[1]}", stderr_level=logging.ERROR):
            execute_from_command_line(sys.argv)
        return
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
