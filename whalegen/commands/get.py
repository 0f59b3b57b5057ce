"""`whalegen get KIND [NAME] [-o wide|json|yaml] [-l key=value]`: list objects through the API, kubectl's
way. `-o yaml` prints documents `whalegen apply -f` takes back unchanged (for the kinds apply knows);
whalegen/commands/_objects.py has the kinds and their short names."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from whalegen.commands._errors import EXIT_INVALID, CliError
from whalegen.commands._http import ApiError, Client, add_connection_arguments, print_error
from whalegen.commands._objects import KINDS, fetch, kind_info, parse_selector, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = "; ".join(f"{k.plural} ({', '.join(k.aliases)})" for k in KINDS)
    parser.add_argument("kind", help=f"what to list: {names}")
    parser.add_argument(
        "name", nargs="?", help="only this object (its key: pool name, TENANT/QUEUE, CLUSTER/NODE, id)"
    )
    parser.add_argument(
        "-o", "--output", choices=["wide", "json", "yaml"], help="wide: more columns; json/yaml: whole"
    )
    parser.add_argument("-l", "--selector", help="labels, key=value[,key=value] (nodes carry labels)")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    kind = kind_info(args.kind)
    selector = parse_selector(args.selector)
    if selector and not kind.has_labels:
        raise CliError(f"{kind.plural} carry no labels; -l works on nodes", EXIT_INVALID)
    try:
        items = fetch(Client.from_args(args), kind, args.name, selector)
    except ApiError as exc:
        if exc.status == 404 and args.name:
            return CliError(
                f"no {kind.name.lower()} {args.name!r} (or not one you may see)", EXIT_INVALID
            ).report()
        return print_error(exc)
    if args.name and not items:
        return CliError(
            f"no {kind.name.lower()} {args.name!r} (or not one you may see)", EXIT_INVALID
        ).report()
    if args.output == "yaml":
        sys.stdout.write(yaml.safe_dump_all(items, sort_keys=False, allow_unicode=True) if items else "")
    elif args.output == "json":
        whole = items[0] if args.name else {"kind": f"{kind.name}List", "items": items}
        print(json.dumps(whole, indent=2))
    elif not items:
        print(f"No {kind.plural} found.", file=sys.stderr)
    else:
        wide = kind.wide + ((("SOURCE", "status.applied_from"),) if kind.declarative else ())
        columns = kind.columns + (wide if args.output == "wide" else ())
        print("\n".join(table(items, columns)))
    return 0
