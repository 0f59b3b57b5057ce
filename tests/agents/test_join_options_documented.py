"""docs/agent.md lists every option `whalegen agent join` reads, and only those.

Which options a join reads is found by running it: the parsed arguments record each one read, for a
join that goes all the way (a host holding a credential, forced, to a plane that does not answer), so a
new option the join starts to read fails this test until the docs name it. The list lacked `--force`."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Any

from agents.join import NodeCredential, credential_save
from whalegen import logformat
from whalegen.commands import agent as agent_command

ROOT = Path(__file__).resolve().parents[2]
LIST_OPENING = "`whalegen agent join` options"


class ReadRecorder(argparse.Namespace):
    """Parsed arguments that remember the name of each one read."""

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        object.__setattr__(self, "read", set())

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_") and name != "read":
            object.__getattribute__(self, "read").add(name)
        return object.__getattribute__(self, name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whalegen agent")
    agent_command.add_arguments(parser)
    return parser


def _flags_the_join_reads(tmp_path: Path) -> set[str]:
    state = tmp_path / "state"
    credential_save(state, NodeCredential("wgn_old", "http://127.0.0.1:9", "1", "gpu-1", "eu-1", "p", 0.0))
    argv = ["join", "--server", "http://127.0.0.1:9", "--join-token", "wgj_x", "--pool", "p", "--force",
            "--backend", "sim", "--state-dir", str(state)]  # fmt: skip
    parser = _parser()
    args = parser.parse_args(argv, namespace=ReadRecorder())
    args.read.clear()  # parsing itself looks at every argument
    root = logging.getLogger()
    handlers, level, component = list(root.handlers), root.level, logformat._component
    try:
        # Port 9 (discard) answers nothing: the join goes as far as asking the plane, and no further.
        assert agent_command.run(args) == 69
    finally:
        logging.captureWarnings(False)
        root.handlers[:] = handlers
        root.setLevel(level)
        logformat._component = component  # the agent's logging set-up names the process "agent"
    read = args.read
    return {flag for action in parser._actions if action.dest in read for flag in action.option_strings}


def _documented_flags() -> set[str]:
    text = (ROOT / "docs" / "agent.md").read_text()
    start = text.index(LIST_OPENING)
    paragraph = text[start : text.index("\n\n", start)]
    return set(re.findall(r"`(--[a-z][a-z-]*)", paragraph))


def test_the_docs_list_every_option_the_join_reads_and_no_other(tmp_path: Path) -> None:
    read = _flags_the_join_reads(tmp_path)
    assert {"--server", "--join-token", "--pool", "--force", "--state-dir"} <= read  # the recorder works
    assert _documented_flags() == read - {"-h", "--help"}
