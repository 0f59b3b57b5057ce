"""Tiny parent for one task: runs the command, waits, and records how it ended in a file.

`python -m agents.launch EXIT_FILE -- COMMAND…`. The agent starts this in a new session, so the whole
task is one process group it can signal. The launcher outlives the agent, which lets a restarted
agent learn the exit code of a task it did not start (it is no longer that process's parent).
It ignores SIGTERM/SIGINT itself (handlers, reset on exec, so the command keeps default dispositions)
and survives to record the command's fate; SIGKILL ends it too and then no file is written.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m agents.launch EXIT_FILE -- COMMAND…", file=sys.stderr)
        return 2
    exit_file, command = argv[0], argv[2:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as error:
            print(f"whalegen launch: cannot run {command[0]!r}: {error}", file=sys.stderr)
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    record = {"exit_code": code, "signal": None} if code >= 0 else {"exit_code": None, "signal": -code}
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as out:
        json.dump(record, out)
    os.replace(tmp, exit_file)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
