"""`whalegen describe KIND NAME`: one object in full, for a person: its identity, labels, spec and status,
where it was applied from; a task with its events, a GPU with its compute units, an override with its
audit trail."""

from __future__ import annotations

import argparse
from typing import Any

from whalegen.commands._errors import EXIT_INVALID, CliError
from whalegen.commands._http import ApiError, Client, add_connection_arguments, print_error
from whalegen.commands._objects import KINDS, cell, fetch, kind_info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", help="one of " + ", ".join(k.plural for k in KINDS) + " (or a short name)")
    parser.add_argument("name", help="the object's key: pool name, TENANT/QUEUE, CLUSTER/NODE, or an id")
    add_connection_arguments(parser)


def _lines(mapping: dict[str, Any], indent: int) -> list[str]:
    out: list[str] = []
    pad = " " * indent
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out.append(f"{pad}{key}:")
            out += _lines(value, indent + 2)
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            out.append(f"{pad}{key}:")
            for item in value:
                out.append(f"{pad}  - " + ", ".join(f"{k}: {cell(v)}" for k, v in item.items()))
        elif isinstance(value, list):
            out.append(f"{pad}{key}: {', '.join(cell(v) for v in value) or '-'}")
        else:
            out.append(f"{pad}{key}: {cell(value)}")
    return out


def _document(document: dict[str, Any]) -> list[str]:
    metadata = dict(document.get("metadata") or {})
    labels = metadata.pop("labels", None)
    status = dict(document.get("status") or {})
    source = status.pop("applied_from", None)
    lines = [f"Kind: {document['kind']}"]
    lines += [f"{key.title()}: {value}" for key, value in metadata.items()]
    if labels is not None:
        lines.append("Labels: " + (", ".join(f"{k}={v}" for k, v in labels.items()) or "-"))
    lines.append(f"Applied from: {source or '- (not from a file)'}")
    lines += ["Spec:", *_lines(document.get("spec") or {}, 2)]
    if status:
        lines += ["Status:", *_lines(status, 2)]
    return lines


def _extra(client: Client, plural: str, item: dict[str, Any]) -> list[str]:
    """What a person asks next: a task's events, an override's audit trail."""
    if plural == "tasks":
        events = client.call("GET", f"/tasks/{item['id']}/events/", params={"limit": 1000})["results"]
        lines = ["events:"]
        for e in events:
            moved = f"{e['from_state'] or '-':>9} -> {e['to_state']:<9}"
            lines.append(f"  {e['created_at']}  {moved} {e['actor']}: {e['reason']}")
        return lines
    return []


def run(args: argparse.Namespace) -> int:
    kind = kind_info(args.kind)
    try:
        client = Client.from_args(args)
        items = fetch(client, kind, args.name, {})
        if not items:
            raise ApiError(404, None)
        item = items[0]
        lines = _document(item) if kind.declarative else _lines(item, 0) + _extra(client, kind.plural, item)
    except ApiError as exc:
        if exc.status == 404:
            return CliError(
                f"no {kind.name.lower()} {args.name!r} (or not one you may see)", EXIT_INVALID
            ).report()
        return print_error(exc)
    print("\n".join(lines))
    return 0
