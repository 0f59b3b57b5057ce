"""`whalegen tasks ls|show|logs|wait|cancel`: read, follow, wait for and cancel tasks through the API.

`wait` is `submit --wait` for a task already submitted (a CI job that records the id first, so that it
can cancel the task when the job is cancelled; docs/ci.md): same output, same exit statuses."""

from __future__ import annotations

import argparse
import json
import shlex

from whalegen.commands._errors import EXIT_INVALID, CliError
from whalegen.commands._http import ApiError, Client, add_connection_arguments, print_error
from whalegen.commands._logs import Follower, print_lines
from whalegen.commands.submit import wait_for

FOLLOW_WAIT_S = 20.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("ls", help="list tasks, newest first")
    ls.add_argument("--state", action="append", help="only these states (repeatable)")
    ls.add_argument("--queue", help="only this queue")
    ls.add_argument("--tenant", help="only this tenant")
    ls.add_argument("--limit", type=int, default=50)
    show = sub.add_parser("show", help="one task with its events")
    show.add_argument("task_id", type=int)
    show.add_argument("--json", action="store_true", help="print the raw JSON")
    logs = sub.add_parser("logs", help="a task's output (stdout to stdout, stderr to stderr)")
    logs.add_argument("task_id", type=int)
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the task has ended")
    logs.add_argument("--attempt", type=int, help="which run (0 first; default the current one)")
    logs.add_argument("--tail", type=int, help="start with the last N lines")
    wait = sub.add_parser("wait", help="follow a task until it ends; exit with its exit code")
    wait.add_argument("task_id", type=int)
    wait.add_argument("--timeout", type=float, default=3600.0, help="give up after (3600 s): exit 124")
    wait.add_argument("--interval", type=float, default=2.0, help="seconds between polls (2)")
    wait.add_argument("--quiet", action="store_true", help="only state changes, not the task's output")
    cancel = sub.add_parser("cancel", help="cancel a task")
    cancel.add_argument("task_id", type=int)
    cancel.add_argument("--reason", default="")
    for command in (ls, show, logs, wait, cancel):
        add_connection_arguments(command)


def _ls(client: Client, args: argparse.Namespace) -> int:
    params: dict[str, object] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    if args.queue:
        params["queue"] = args.queue
    if args.tenant:
        params["tenant"] = args.tenant
    page = client.call("GET", "/tasks/", params=params)
    print(f"{'ID':>6}  {'STATE':<10} {'TENANT/QUEUE':<24} {'GPUS':<10} {'RUNTIME':<9} {'PRIO':>4}  NAME")
    for task in page["results"]:
        gpus = f"{task['gpu_count']}x{task['gpu_milli']}m"
        where = f"{task['tenant']}/{task['queue']}"
        prio, runtime = task["priority"], task.get("runtime") or "-"
        print(f"{task['id']:>6}  {task['state']:<10} {where:<24} {gpus:<10} {runtime:<9} {prio:>4}  "
              f"{task['name']}")  # fmt: skip
    shown = len(page["results"])
    if page["count"] > shown:
        print(f"({shown} of {page['count']}; use --limit)")
    return 0


def _show(client: Client, args: argparse.Namespace) -> int:
    task = client.call("GET", f"/tasks/{args.task_id}/")
    events = client.call("GET", f"/tasks/{args.task_id}/events/", params={"limit": 1000})["results"]
    if args.json:
        print(json.dumps({**task, "events": events}, indent=2))
        return 0
    for key in ("id", "state", "tenant", "queue", "pool", "name", "priority"):
        print(f"{key:>16}: {task[key]}")
    # `attempts` counts requeues (after a loss or a preemption): "attempts: 0" read as "never ran".
    print(f"{'requeues':>16}: {task['attempts']}")
    print(f"{'why pending':>16}: {task['why_pending'] or '-'}")
    print(
        f"{'request':>16}: {task['gpu_count']} GPU x {task['gpu_milli']} milli, isolation {task['isolation']}"
    )
    print(f"{'runtime':>16}: {task.get('runtime') or '-'}")
    if task.get("image"):
        print(f"{'image':>16}: {task['image']}")
    print(f"{'command':>16}: {_argv(task['command']) or '(none)'}")
    if task.get("working_dir"):
        print(f"{'working dir':>16}: {task['working_dir']}")
    # Keys only: the plane never sends env values back (they may be secrets).
    print(f"{'env keys':>16}: {', '.join(task.get('env_keys') or []) or '(none)'}")
    print(f"{'exit code':>16}: {'-' if task['exit_code'] is None else task['exit_code']}")
    if task["state"] == "failed":
        print(f"{'failure reason':>16}: {task.get('failure_reason') or '-'}")
    elif task["state"] == "cancelled":
        ended = [event for event in events if event["to_state"] == "cancelled"]
        print(f"{'cancel reason':>16}: {ended[-1]['reason'] if ended else '-'}")
    print("events:")
    for event in events:
        print(f"  {event['created_at']}  {event['from_state'] or '-':>9} -> {event['to_state']:<9} "
              f"{event['actor']}: {event['reason']}")  # fmt: skip
    return 0


def _argv(command: list[str]) -> str:
    """The argv as a shell would take it back (so a person can paste it)."""
    return shlex.join(command)


def _check_attempt(client: Client, task_id: int, attempt: int) -> None:
    """Refuse an attempt the task has not had (the logs endpoint answers it with an empty page)."""
    page = client.call("GET", f"/tasks/{task_id}/logs/", params={"limit": 1, "attempt": max(attempt, 0)})
    current = page["task_attempt"]
    if 0 <= attempt <= current:
        return
    if current == 0:
        has = (
            "it has one: attempt 0"
            if page["task_state"] not in ("pending", "admitted", "assigned")
            else "it has not run yet (attempt 0)"
        )
    else:
        has = f"it has attempts 0 to {current}"
    raise CliError(f"task {task_id} has no attempt {attempt}; {has}", EXIT_INVALID)


def _logs(client: Client, args: argparse.Namespace) -> int:
    if args.attempt is not None:
        _check_attempt(client, args.task_id, args.attempt)
    follower = Follower(args.task_id, attempt=args.attempt)
    if args.tail:
        params: dict[str, object] = {"tail": args.tail}
        if args.attempt is not None:
            params["attempt"] = args.attempt
        page = client.call("GET", f"/tasks/{args.task_id}/logs/", params=params)
        print_lines(page["lines"])
        follower.attempt, follower.offset = page["attempt"], page["next_offset"]
        follower.complete = page["complete"]
    while True:
        page = follower.step(client, wait_s=FOLLOW_WAIT_S if args.follow else 0)
        if not args.follow:
            if not page["lines"]:
                return 0
            continue
        pinned = args.attempt is not None
        if not pinned and page["task_attempt"] > page["attempt"] and (follower.complete or not page["lines"]):
            follower.next_attempt(page["task_attempt"])
        elif follower.complete:
            return 0


def _wait(client: Client, args: argparse.Namespace) -> int:
    return wait_for(
        client, [args.task_id], timeout_s=args.timeout, interval_s=args.interval, quiet=args.quiet
    )


def _cancel(client: Client, args: argparse.Namespace) -> int:
    task = client.call("POST", f"/tasks/{args.task_id}/cancel/", json={"reason": args.reason})
    print(f"task {task['id']}: {task['state']}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        client = Client.from_args(args)
        action = {"ls": _ls, "show": _show, "logs": _logs, "wait": _wait, "cancel": _cancel}[args.action]
        return action(client, args)
    except ApiError as exc:
        if exc.status == 404 and getattr(args, "task_id", None) is not None:
            message = f"no task {args.task_id} (or not one this token's tenant can see)"
            return CliError(message, EXIT_INVALID).report()
        return print_error(exc)
