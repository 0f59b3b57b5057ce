"""`whalegen submit FILE.yaml [--wait]`: submit one task (or several, under `tasks:`) through the API.

The YAML holds the request fields of the API (`queue`, `gpu_count`, `gpu_milli`, `image`, `command`, …):
in a container pool `image` names the OCI image (default: the queue's) and `command` is the argv in it.
With `--wait` it polls until the task reaches a final state and prints every state change (and every
new why-pending reason) on stdout, and streams the task's output as it arrives: its stdout to stdout,
its stderr to stderr (`--quiet`: state changes only). A failed task's reason follows on stderr. It
exits with the task's own exit code: 0 when it succeeded, the command's exit code when it failed with
one (1 when it failed without one, or was cancelled), 124 when `--timeout` ran out first. With several
tasks: the first non-zero of those, in submission order. A refusal, an unreachable plane or a token the
plane does not accept each has its own exit status (whalegen.commands._http; docs/ci.md).

`command` items and `env` values are text; a YAML number or boolean there (`[train, --epochs, 3]`) is
sent as the text the user typed ("3"), with a note on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from whalegen.commands._errors import (
    EXIT_INVALID,
    EXIT_TASK_FAILED,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    CliError,
)
from whalegen.commands._http import ApiError, Client, Unreachable, add_connection_arguments, print_error
from whalegen.commands._logs import Follower, failure_reason

FINAL = {"succeeded", "failed", "cancelled"}
# Output still on its way when the task is seen final (a cancelled run's last lines) is waited for
# this long at most.
DRAIN_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="YAML file: one task's fields, or `tasks: [...]` for several")
    add_connection_arguments(parser)
    parser.add_argument("--tenant", help="tenant slug (default: the token's tenant)")
    parser.add_argument(
        "--idempotency-key", help="retry-safe key: submitting again with it returns the same task"
    )
    parser.add_argument("--wait", action="store_true", help="poll until the task finishes")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait gives up after (3600)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls (2)")
    parser.add_argument(
        "--quiet", action="store_true", help="with --wait: only state changes, not the task's output"
    )


class _TaskFileLoader(yaml.SafeLoader):
    """YAML as the API reads JSON: `name: 2026-01-01` is the string the user typed, not a date (which
    JSON cannot carry). Every other implicit type (numbers, booleans, null) is kept."""


_TaskFileLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


_STR = "tag:yaml.org,2002:str"
# Plain YAML scalars that resolve to these are text the user typed: `3`, `0.10`, `yes`, `true`.
_TEXT_LIKE = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"}


def _as_text(node: yaml.Node, path: str, notes: list[str], *, secret: bool) -> None:
    """Take a plain number or boolean scalar as the string it was written as (`3` → "3"), with a note."""
    if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag in _TEXT_LIKE:
        if secret:  # env values may be secrets: never echoed
            notes.append(f"{path}: took the value as a string (env values are text)")
        else:
            notes.append(f'{path}: took {node.value} as the string "{node.value}" (argv items are text)')
        node.tag = _STR


def _texts_in_task(node: yaml.Node, prefix: str, notes: list[str]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        if key.value == "command" and isinstance(value, yaml.SequenceNode):
            for index, item in enumerate(value.value):
                _as_text(item, f"{prefix}command[{index}]", notes, secret=False)
        elif key.value == "env" and isinstance(value, yaml.MappingNode):
            for name, item in value.value:
                _as_text(item, f"{prefix}env.{name.value}", notes, secret=True)
        elif key.value == "tasks" and not prefix and isinstance(value, yaml.SequenceNode):
            for index, item in enumerate(value.value):
                _texts_in_task(item, f"tasks[{index}].", notes)


def _parse(text: str) -> tuple[Any, list[str]]:
    """The document, with `command` items and `env` values as text (and a note for each one taken)."""
    loader = _TaskFileLoader(text)
    notes: list[str] = []
    try:
        node = loader.get_single_node()
        if node is None:
            return None, notes
        _texts_in_task(node, "", notes)
        return loader.construct_document(node), notes
    finally:
        loader.dispose()


def _load(path: Path) -> dict[str, Any]:
    """The task file as the API will read it; CliError (exit 65) when it cannot be."""
    try:
        document, notes = _parse(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CliError(
            f"{path} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}); save it as UTF-8",
            EXIT_INVALID,
        ) from exc
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read {path}: {exc}", EXIT_INVALID) from exc
    if not isinstance(document, dict):
        raise CliError(f"{path} must hold a mapping of task fields (or `tasks: [...]`)", EXIT_INVALID)
    try:
        json.dumps(document, allow_nan=False)
    except (TypeError, ValueError) as exc:  # !!binary, !!set, .nan: nothing JSON (or the API) can carry
        raise CliError(f"{path} holds a value the API cannot take: {exc}", EXIT_INVALID) from exc
    for note in notes:
        print(f"whalegen: note: {note}", file=sys.stderr)
    return document


def _exit_status(task: dict[str, Any]) -> int:
    if task["state"] == "succeeded":
        return 0
    code = task.get("exit_code")
    # Exit statuses are 0–255 to a shell; a code outside (e.g. -9 for a signal) reads as 1.
    failed_with_code = task["state"] == "failed" and isinstance(code, int) and 0 < code < 256
    return code if failed_with_code else EXIT_TASK_FAILED


def wait_for(
    client: Client, task_ids: list[int], *, timeout_s: float, interval_s: float, quiet: bool = False
) -> int:
    """Poll tasks until all are final; print each state change and each new why-pending reason, and
    (unless `quiet`) stream their output. Returns the exit status (see the module's docstring)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[int, tuple[str, str]] = {}
    last: dict[int, dict[str, Any]] = {}
    followers = {} if quiet else {task_id: Follower(task_id) for task_id in task_ids}
    outage = _Outage()
    while True:
        waited = False
        for task_id in task_ids:
            task = outage.poll(client, task_id)
            if task is None:  # the plane is away: the task goes on, and so does the wait
                break
            last[task_id] = task
            final = task["state"] in FINAL
            # A change to a running state is said before the output it brings; a final state after the
            # last of the output, so the exit code is the last line.
            if not final:
                _say_change(client, task, seen)
            follower = followers.get(task_id)
            if follower is not None:
                # One task: the output long poll paces the loop; several: a quick look at each. Neither
                # the poll nor the sleep below outlasts the deadline (`--timeout 1` waited 6 s).
                pace_s = _left(deadline, interval_s) if len(task_ids) == 1 else 0
                waited |= _stream(client, follower, task, wait_s=pace_s)
            if final:
                _say_change(client, task, seen)
        if len(last) == len(task_ids) and all(state in FINAL for state, _ in seen.values()):
            return next((code for tid in task_ids if (code := _exit_status(last[tid])) != 0), 0)
        if time.monotonic() >= deadline:
            waiting = ", ".join(f"{tid} {state}" for tid, (state, _) in seen.items() if state not in FINAL)
            print(f"whalegen: gave up after {timeout_s:g} s; still not finished: {waiting}", file=sys.stderr)
            if outage.since is not None:
                print(f"whalegen: {outage.why}", file=sys.stderr)
                return EXIT_UNREACHABLE
            return EXIT_TIMEOUT
        if not waited:
            time.sleep(_left(deadline, interval_s))


def _left(deadline: float, most_s: float) -> float:
    """Seconds to wait now: `most_s`, or what is left before `deadline` if that is less (never below 0)."""
    return max(0.0, min(most_s, deadline - time.monotonic()))


class _Outage:
    """The wait's view of the plane: a dropped connection, a restart (5xx) or a 429 while a task runs is
    not the task's failure, so `--wait` keeps asking until its timeout, saying once when the plane went
    away and once when it is back (a CI job must not fail because the plane was redeployed)."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.why = ""

    def poll(self, client: Client, task_id: int) -> dict[str, Any] | None:
        try:
            task = client.call("GET", f"/tasks/{task_id}/")
        except Unreachable as exc:
            self._down(exc.message)
            return None
        except ApiError as exc:
            if exc.status < 500 and exc.status != 429:
                raise
            self._down(f"the plane answered HTTP {exc.status}")
            return None
        if self.since is not None:
            away_s = time.monotonic() - self.since
            print(f"whalegen: the plane answers again after {away_s:.0f} s", file=sys.stderr)
            self.since = None
        return task

    def _down(self, why: str) -> None:
        self.why = why
        if self.since is None:
            self.since = time.monotonic()
            print(f"whalegen: {why}; still waiting (the task goes on) and retrying", file=sys.stderr)


def _say_change(client: Client, task: dict[str, Any], seen: dict[int, tuple[str, str]]) -> None:
    """Print the task's state (and why-pending reason) when it differs from what was last printed."""
    task_id = task["id"]
    now = (task["state"], task.get("why_pending") or "")
    if seen.get(task_id) == now:
        return
    seen[task_id] = now
    why = f" ({now[1]})" if now[1] else ""
    extra = f" exit code {task['exit_code']}" if task.get("exit_code") is not None else ""
    print(f"task {task_id}: {now[0]}{why}{extra}", flush=True)
    if now[0] == "failed":
        print(f"whalegen: task {task_id} failed: {failure_reason(client, task_id)}", file=sys.stderr)


def _stream(client: Client, follower: Follower, task: dict[str, Any], *, wait_s: float) -> bool:
    """Print what the task's current run wrote since the last look; for a final task, all of it (up to
    DRAIN_S) before its final state is printed. True if it long-polled (the caller need not sleep)."""
    if follower.attempt is not None and task["attempts"] != follower.attempt:
        follower.next_attempt(task["attempts"])
    if task["state"] in ("pending", "admitted", "assigned") and task["attempts"] == (follower.attempt or 0):
        return False  # nothing runs yet
    try:
        if task["state"] not in FINAL:
            follower.step(client, wait_s=wait_s)
            return wait_s > 0
        drain_until = time.monotonic() + DRAIN_S
        while not follower.complete and time.monotonic() < drain_until:
            page = follower.step(client, wait_s=min(2.0, DRAIN_S))
            if not page["lines"] and page["complete"]:
                break
    except ApiError as exc:
        if exc.status == 404:
            follower.complete = True  # a plane without the logs endpoint: state changes only
        elif exc.status < 500:
            raise
    except (Unreachable, requests.RequestException) as exc:
        # A slow or dropped read of the output must not end the wait: the next round reads on from
        # the same line, so nothing is lost or repeated.
        why = exc.message if isinstance(exc, Unreachable) else exc.__class__.__name__
        print(f"whalegen: reading task {follower.task_id}'s output failed ({why}); retrying", file=sys.stderr)
    return False


def _idempotency_key(args: argparse.Namespace, document: dict[str, Any]) -> str | None:
    """The key to send: `--idempotency-key`, else the file's. An empty one (`"$CI_PIPELINE_ID"` with the
    variable unset) is said on stderr: without a key, a retried job submits a second task."""
    given = (
        args.idempotency_key if args.idempotency_key is not None else document.pop("idempotency_key", None)
    )
    if given is None:
        return None
    key = str(given).strip()
    if not key:
        print(
            "whalegen: warning: the idempotency key is empty (is the variable it comes from, such as "
            "$CI_PIPELINE_ID, set?); submitting without one, so a retried job submits a new task",
            file=sys.stderr,
        )
        return None
    return key


def run(args: argparse.Namespace) -> int:
    document = _load(args.file)
    client = Client.from_args(args)
    tenant = args.tenant or document.pop("tenant", None)
    key = _idempotency_key(args, document)
    body: dict[str, Any] = document
    try:
        if "tasks" in document:
            body = {"tasks": document["tasks"]}
            if tenant:
                body["tenant"] = tenant
            if key and isinstance(body["tasks"], list):
                # One key for the pipeline's batch: each task's own key is the batch's plus its index,
                # unless the file gives it one.
                for index, item in enumerate(body["tasks"]):
                    if isinstance(item, dict):
                        item.setdefault("idempotency_key", f"{key}/{index}")
            tasks = client.call("POST", "/tasks/bulk/", json=body)
        else:
            if tenant:
                document["tenant"] = tenant
            headers = {"Idempotency-Key": key} if key else None
            tasks = [client.call("POST", "/tasks/", json=document, headers=headers)]
        for task in tasks:
            where = f"{task['tenant']}/{task['queue']}"
            print(f"task {task['id']}: {task['state']} in {where} (pool {task['pool']})")
        if not args.wait:
            return 0
        return wait_for(
            client,
            [task["id"] for task in tasks],
            timeout_s=args.timeout,
            interval_s=args.interval,
            quiet=args.quiet,
        )
    except ApiError as exc:
        return print_error(exc, sent=body, client=client)
