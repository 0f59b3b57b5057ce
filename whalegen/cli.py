"""`whalegen …`: one entry point for operators, CI pipelines and GPU hosts.

Each subcommand lives in its own module under `whalegen.commands` with two functions,
`add_arguments(parser)` and `run(args) -> int`. Only the chosen module is imported, so `whalegen agent`
on a GPU host never imports Django, and `whalegen replay` never touches a database.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from whalegen.commands._errors import CliError

# What a shell reports for a process that SIGPIPE ended (128 + 13), as `yes | head` shows for `yes`.
EXIT_BROKEN_PIPE = 141

# name → (module, one-line help). Keep sorted by how often people type them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("whalegen.commands.demo", "run the whole system on the embedded default (SQLite, in-process)"),
    "submit": ("whalegen.commands.submit", "submit a task from a YAML file, optionally wait for it"),
    "tasks": ("whalegen.commands.tasks", "list, show, follow, wait for or cancel tasks through the API"),
    "apply": ("whalegen.commands.apply", "create or change clusters, pools, tenants, quotas… from YAML"),
    "get": ("whalegen.commands.get", "list objects of a kind (-o yaml prints what apply takes back)"),
    "describe": ("whalegen.commands.describe", "show one object in full: spec, status, where it came from"),
    "accounting": ("whalegen.commands.accounting", "GPU-hours (and money) per tenant, queue, pool, model"),
    "token": ("whalegen.commands.token", "make, list or revoke API tokens (--user: operator, on the plane)"),
    "create": ("whalegen.commands.create", "make a join token for GPU hosts (operator)"),
    "delete": ("whalegen.commands.delete", "revoke a join token or a node's credential (operator)"),
    "approve": ("whalegen.commands.approve", "let a node that joined with an approval token take work"),
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
    """Run one command; a reader that went away (`whalegen tasks ls | head`) ends it quietly."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler, not at interpreter exit
    except BrokenPipeError:
        # Python ignores SIGPIPE, so the write failed with EPIPE instead of ending the process. Stop as a
        # Unix tool that SIGPIPE ended would: no traceback, exit 141. Standard output goes to /dev/null
        # so that the interpreter's final flush of what is still buffered does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
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
    try:
        return int(module.run(parsed) or 0)
    except CliError as exc:  # one line and its exit status (docs/ci.md), never a traceback
        return exc.report()


if __name__ == "__main__":
    raise SystemExit(main())
