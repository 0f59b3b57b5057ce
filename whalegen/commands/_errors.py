"""How the pipeline-facing commands end: one exit status per thing a pipeline can act on (retry, fix
the file, fix the token). They follow sysexits(3) where one fits; docs/ci.md has the table.

Standard library only: `whalegen.cli` catches `CliError` for every command without importing requests.
"""

from __future__ import annotations

import sys

# Exit statuses (docs/ci.md, "Exit codes"). 0 and the task's own code come from `submit --wait`.
EXIT_TASK_FAILED = 1  # the task failed without an exit code of its own, or was cancelled
EXIT_INVALID = 65  # EX_DATAERR: the plane refused the request as invalid (or the task file is unreadable)
# The plane refused the request because it can never run there (no node or quota that large, a GPU
# model or isolation the pool lacks). sysexits(3) has no code for this; 66 is the next one after
# "invalid", so the two refusals sit side by side.
EXIT_NEVER_RUNS = 66
EXIT_UNREACHABLE = 69  # EX_UNAVAILABLE: no answer from the plane, or it answered 5xx
EXIT_RETRY_LATER = 75  # EX_TEMPFAIL: the plane asked to come back later (HTTP 429)
EXIT_AUTH = 77  # EX_NOPERM: no token, or the plane did not accept it (401) or allow the action (403)
EXIT_CONFIG = 78  # EX_CONFIG: WHALEGEN_URL / --server is not a URL the client can use
EXIT_TIMEOUT = 124  # `--wait` ran out of `--timeout` (the status timeout(1) uses)

# The machine-readable `code` a refusal body carries when the request can never run in the pool
# (docs/scheduling.md, "Admission"); every other 400 exits 65.
NEVER_RUNS_CODES = frozenset({"cannot_run_here"})


class CliError(Exception):
    """A failure said in one message, with the exit status a pipeline acts on."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def report(self) -> int:
        print(f"whalegen: {self.message}", file=sys.stderr)
        return self.exit_code
