"""`whalegen apply -f FILE|DIR [--dry-run] [--prune]`: make the plane hold what the files describe.

Each YAML document is one object (whalegen/commands/_objects.py lists the kinds; docs/apply.md,
"Describing the fleet: apply", their fields). The plane answers one line per object, kubectl's way:
`pool/h100-train created`, `queue/vision/train configured` with the fields that changed (old → new),
`unchanged`, `pruned`, or `refused` with the reason. Applying the same files again changes nothing.

`--local` applies straight to the plane's database (its settings: DATABASE_URL, as `whalegen token create
--user` and `whalegen create join-token`), as a platform admin, with no token. That is how a fresh plane
gets its first tenant — an API token is always scoped to one, so before any exists nobody holds a token
to call `apply` with — and what `whalegen token create --user ADMIN --tenant T` then needs.

Exit status: 0 when every object was applied, 65 when the plane refused a document as invalid (nothing
was applied then) or refused an object (the others were applied); the connection and token failures
exit as every pipeline-facing command does (docs/ci.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from whalegen.commands._errors import EXIT_INVALID, CliError
from whalegen.commands._http import ApiError, Client, add_connection_arguments, print_error
from whalegen.commands._objects import kind_info

SUFFIXES = (".yaml", ".yml", ".json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        help="a file, or a directory of *.yaml (repeatable)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the difference; change nothing")
    parser.add_argument(
        "--prune",
        action="store_true",
        help="also delete objects an earlier apply made, of the kinds in the files, that they no longer name",
    )
    parser.add_argument(
        "-o", "--output", choices=["text", "json"], default="text", help="json: the plane's answer"
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="operator on the plane: apply in its database as a platform admin, no token (a fresh plane's "
        "first tenant)",
    )
    add_connection_arguments(parser)


def _files(names: list[str]) -> list[Path]:
    files: list[Path] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise CliError(f"{name}: no such file or directory", EXIT_INVALID)
    return files


def load(names: list[str]) -> tuple[list[Any], list[str]]:
    """Every document of the files with its source, `FILE#N` (N counts the file's non-empty documents)."""
    documents: list[Any] = []
    sources: list[str] = []
    for path in _files(names):
        try:
            found = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"{path}: cannot read it ({exc})", EXIT_INVALID) from exc
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1})" if where is not None else ""
            raise CliError(f"{path}: not YAML{at}: {getattr(exc, 'problem', exc)}", EXIT_INVALID) from exc
        for number, document in enumerate(found, start=1):
            documents.append(document)
            sources.append(f"{path}#{number}")
    if not documents:
        raise CliError(f"no documents in {', '.join(names)}", EXIT_INVALID)
    return documents, sources


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def report(answer: dict[str, Any]) -> int:
    suffix = " (dry run)" if answer["dry_run"] else ""
    refused = 0
    for result in answer["results"]:
        try:
            name = kind_info(result["kind"]).name.lower()
        except CliError:
            name = result["kind"].lower()
        head = f"{name}/{result['key']} {result['outcome']}{suffix}"
        if result["outcome"] == "refused":
            refused += 1
            print(f"{head}: {result['reason']}")
            continue
        print(head)
        if result["outcome"] == "configured":
            for path, (old, new) in result["diff"].items():
                print(f"  {path}: {_show(old)} → {_show(new)}")
        for note in result["notes"]:
            print(f"  note: {note}")
    return EXIT_INVALID if refused else 0


def _refused_documents(problems: list[Any]) -> int:
    print("whalegen: the plane refused the documents; nothing was applied", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return EXIT_INVALID


def _apply_local(body: dict[str, Any]) -> dict[str, Any] | int:
    """The operator's path: the service the API calls, as the system with a platform admin's access (as
    `whalegen demo` seeds itself); recorded as applied by `system`."""
    from whalegen.commands._plane import plane_setup

    plane_setup()
    from django.core.exceptions import ValidationError

    from apps.declarative.services import objects_apply
    from apps.tenants.selectors import Access

    try:
        results = objects_apply(
            documents=body["documents"],
            sources=body["sources"],
            access=Access(platform_admin=True),
            user=None,
            dry_run=body["dry_run"],
            prune=body["prune"],
        )
    except ValidationError as exc:
        return _refused_documents(exc.message_dict.get("documents", exc.messages))
    return {"dry_run": body["dry_run"], "results": [asdict(result) for result in results]}


def run(args: argparse.Namespace) -> int:
    documents, sources = load(args.filename)
    body = {"documents": documents, "sources": sources, "dry_run": args.dry_run, "prune": args.prune}
    if args.local:
        if args.server or args.token:
            message = "--local applies in the plane's database, not through a server; drop --server/--token"
            raise CliError(message, EXIT_INVALID)
        local = _apply_local(body)
        if isinstance(local, int):
            return local
        answer = local
    else:
        try:
            answer = Client.from_args(args).call("POST", "/apply/", json=body)
        except ApiError as exc:
            problems = exc.body.get("documents") if exc.status == 400 and isinstance(exc.body, dict) else None
            if isinstance(problems, list):
                return _refused_documents(problems)
            return print_error(exc)
    if args.output == "json":
        print(json.dumps(answer, indent=2))
        return EXIT_INVALID if any(r["outcome"] == "refused" for r in answer["results"]) else 0
    return report(answer)
