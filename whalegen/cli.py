"""`whalegen …`: one entry point for operators, CI pipelines and GPU hosts.

Each subcommand lives in its own module under `whalegen.commands` with two functions,
`add_arguments(parser)` and `run(args) -> int`. Only the chosen module is imported, so `whalegen agent`
on a GPU host never imports Django, and `whalegen replay` never touches a database.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name → (module, one-line help). Keep sorted by how often people type them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("whalegen.commands.demo", "run the whole system on the embedded default (SQLite, in-process)"),
    "submit": ("whalegen.commands.submit", "submit a task from a YAML file, optionally wait for it"),
    "tasks": ("whalegen.commands.tasks", "list, show or cancel tasks through the API"),
    "accounting": ("whalegen.commands.accounting", "GPU-hours (and money) per tenant, queue, pool, model"),
    "token": ("whalegen.commands.token", "create an API token for a tenant member (operator)"),
    "replay": ("whalegen.commands.replay", "replay a GPU trace through the placement engine"),
    "bench": ("whalegen.commands.bench", "measure placement / cycle speed against a baseline"),
    "agent": ("whalegen.commands.agent", "run the node agent, or inspect this host's GPUs"),
    "forecast": ("whalegen.commands.forecast", "evaluate forecasters against baselines on a trace"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: whalegen COMMAND [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "`whalegen COMMAND --help` describes one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if args[0] in {"-V", "--version"}:
        from whalegen import __version__

        print(__version__)
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"whalegen: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"whalegen {name}", description=help_text)
    module.add_arguments(parser)
    parsed = parser.parse_args(rest)
    return int(module.run(parsed) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
