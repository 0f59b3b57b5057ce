"""`whalegen accounting --from … --to … --by tenant,pool [--csv]`: GPU-hours (and money) through the API."""

from __future__ import annotations

import argparse
from typing import Any

from whalegen.commands._http import ApiError, Client, add_connection_arguments, print_error

GROUPS = ("tenant", "queue", "pool", "gpu_model")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from", dest="start", help="first day or instant counted (default: this month's start)"
    )
    parser.add_argument("--to", dest="end", help="first day or instant not counted (default: now)")
    parser.add_argument(
        "--by", default="tenant", help=f"group by any of {','.join(GROUPS)} (default: tenant)"
    )
    for name in ("tenant", "queue", "pool", "gpu-model"):
        parser.add_argument(
            f"--{name}", help=f"only this {name.replace('-', ' ')} (comma-separated for several)"
        )
    parser.add_argument("--csv", action="store_true", help="print the rows as CSV")
    add_connection_arguments(parser)


def _params(args: argparse.Namespace) -> dict[str, str]:
    params = {"group_by": args.by}
    for key, value in (
        ("from", args.start),
        ("to", args.end),
        ("tenant", args.tenant),
        ("queue", args.queue),
        ("pool", args.pool),
        ("gpu_model", args.gpu_model),
    ):
        if value:
            params[key] = value
    return params


def _table(report: dict[str, Any]) -> str:
    """A fixed-width table: the group columns, GPU-hours, tasks and (with prices) cost, then the total."""
    groups = report["group_by"] or ["scope"]
    priced = report["currency"] is not None
    header = [g.upper() for g in groups] + ["GPU-HOURS", "TASKS"]
    if priced:
        header.append(f"COST ({report['currency']})")

    def cells(row: dict[str, Any], keys: list[str]) -> list[str]:
        out = [*keys, f"{row['gpu_hours']:.3f}", str(row["tasks"])]
        if priced:
            out.append(f"{row['cost']:.2f}" + (" *" if row["unpriced_gpu_hours"] else ""))
        return out

    body = [cells(row, [str(row.get(g, "all")) for g in groups]) for row in report["rows"]]
    total = cells(report["total"], ["total"] + [""] * (len(groups) - 1))
    widths = [max(len(r[i]) for r in [header, *body, total]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < len(groups) else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    lines = [f"GPU-hours from {report['from']} to {report['to']}", line(header)]
    lines += [line(r) for r in body]
    lines += ["-" * len(line(header)), line(total)]
    if priced and report["total"]["unpriced_gpu_hours"]:
        lines.append(f"* includes no price for {report['total']['unpriced_gpu_hours']:.3f} GPU-hours")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    client = Client.from_args(args)
    params = _params(args)
    try:
        if args.csv:
            text = client.call("GET", "/accounting/", params=params, headers={"Accept": "text/csv"})
            print(text, end="")
        else:
            print(_table(client.call("GET", "/accounting/", params=params)))
    except ApiError as exc:
        return print_error(exc)
    return 0
