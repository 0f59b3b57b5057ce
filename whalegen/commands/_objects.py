"""What `whalegen get`, `describe` and `apply` share: the kinds and their short names, kubectl-style, and
how each reads from the API. HTTP only (no Django), like every pipeline-facing command.

| kind      | names                         | read from                  | labels |
|-----------|-------------------------------|----------------------------|--------|
| Cluster   | clusters, cluster, cl         | /api/v1/objects/clusters/  |        |
| Pool      | pools, pool                   | /api/v1/objects/pools/     |        |
| Node      | nodes, node, no               | /api/v1/objects/nodes/     | yes    |
| Tenant    | tenants, tenant, tn           | /api/v1/objects/tenants/   |        |
| Member    | members, member, mem          | /api/v1/objects/members/   |        |
| Queue     | queues, queue, q              | /api/v1/objects/queues/    |        |
| Quota     | quotas, quota, quo            | /api/v1/objects/quotas/    |        |
| Budget    | budgets, budget, bu           | /api/v1/objects/budgets/   |        |
| GpuPrice  | gpuprices, gpuprice, price(s) | /api/v1/objects/gpuprices/ |        |
| Task      | tasks, task, tk               | /api/v1/tasks/             |        |
| Gpu       | gpus, gpu                     | /api/v1/gpus/              |        |
| Override  | overrides, override, ov       | /api/v1/overrides/         |        |
| Token     | tokens, token, tok            | /api/v1/tokens/            |        |

The first nine are documents `apply` takes (`get -o yaml` prints them ready to apply again); the last four
are read-only here: tasks are submitted, GPUs are their agents', overrides are requested and decided,
tokens are made and revoked through their own commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from whalegen.commands._errors import EXIT_INVALID, CliError
from whalegen.commands._http import Client

# A column: (header, path into the document or row; "key" is the object's key).
Column = tuple[str, str]


@dataclass(frozen=True)
class KindInfo:
    name: str
    plural: str
    aliases: tuple[str, ...]
    columns: tuple[Column, ...]
    wide: tuple[Column, ...] = ()
    declarative: bool = True  # read as documents from /objects/; else from `path` as rows
    path: str = ""
    has_labels: bool = False


KINDS: tuple[KindInfo, ...] = (
    KindInfo(
        "Cluster",
        "clusters",
        ("cluster", "cl"),
        (
            ("NAME", "key"),
            ("REGION", "spec.region"),
            ("CORDONED", "spec.cordoned"),
            ("NODES", "status.nodes"),
        ),
    ),
    KindInfo(
        "Pool",
        "pools",
        ("pool",),
        (("NAME", "key"), ("RUNTIME", "spec.runtime"), ("NODES", "status.nodes"), ("GPUS", "status.gpus")),
        (("DESCRIPTION", "spec.description"),),
    ),
    KindInfo(
        "Node",
        "nodes",
        ("node", "no"),
        (("NAME", "key"), ("POOL", "spec.pool"), ("STATE", "status.state"), ("CORDONED", "spec.cordoned")),
        (("CPU_MILLI", "spec.cpu_milli"), ("MEM_MIB", "spec.mem_mib"), ("LABELS", "metadata.labels")),
        has_labels=True,
    ),
    KindInfo(
        "Tenant",
        "tenants",
        ("tenant", "tn"),
        (
            ("NAME", "key"),
            ("DISPLAY NAME", "spec.display_name"),
            ("KIND", "spec.kind"),
            ("PARENT", "spec.parent"),
        ),
        (("RUN_UID", "status.effective_run_uid"),),
    ),
    KindInfo(
        "Member",
        "members",
        ("member", "mem"),
        (("NAME", "key"), ("ROLE", "spec.role")),
        (("EMAIL", "spec.email"),),
    ),
    KindInfo(
        "Queue",
        "queues",
        ("queue", "q"),
        (
            ("NAME", "key"),
            ("POOL", "spec.pool"),
            ("PRIORITY", "spec.default_priority"),
            ("WEIGHT", "spec.weight"),
        ),
        (("IDLE_RECLAIM", "spec.idle_reclaim"), ("IMAGE", "spec.default_image")),
    ),
    KindInfo(
        "Quota",
        "quotas",
        ("quota", "quo"),
        (
            ("NAME", "key"),
            ("GUARANTEED", "spec.guaranteed_gpus"),
            ("BORROW", "spec.borrow_limit_gpus"),
            ("LIVE TASKS", "status.live_tasks"),
        ),
        (("MEM_LIMIT_MIB", "spec.gpu_mem_limit_mib"),),
    ),
    KindInfo(
        "Budget",
        "budgets",
        ("budget", "bu"),
        (("NAME", "key"), ("GPU_HOURS", "spec.gpu_hours"), ("PERIOD", "spec.period")),
        (("CHANGES", "status.changes"),),
    ),
    KindInfo(
        "GpuPrice",
        "gpuprices",
        ("gpuprice", "price", "prices"),
        (("NAME", "key"), ("PER_GPU_HOUR", "spec.per_gpu_hour")),
    ),
    KindInfo(
        "Task",
        "tasks",
        ("task", "tk"),
        (("ID", "id"), ("STATE", "state"), ("TENANT", "tenant"), ("QUEUE", "queue"), ("NAME", "name")),
        (("POOL", "pool"), ("GPUS", "gpu_count"), ("MILLI", "gpu_milli"), ("PRIORITY", "priority")),
        declarative=False,
        path="/tasks/",
    ),
    KindInfo(
        "Gpu",
        "gpus",
        ("gpu",),
        (
            ("ID", "id"),
            ("NODE", "node"),
            ("INDEX", "index"),
            ("MODEL", "model"),
            ("PARTITION", "partition_mode"),
            ("HEALTH", "health"),
        ),
        (("POOL", "pool"), ("CLUSTER", "cluster"), ("UUID", "uuid")),
        declarative=False,
        path="/gpus/",
    ),
    KindInfo(
        "Override",
        "overrides",
        ("override", "ov"),
        (
            ("ID", "id"),
            ("TENANT", "tenant"),
            ("TASK", "task"),
            ("WANTED", "wanted_priority"),
            ("STATE", "state"),
        ),
        (("REQUESTED_BY", "requested_by"), ("EXPIRES", "expires_at"), ("REASON", "reason")),
        declarative=False,
        path="/overrides/",
    ),
    KindInfo(
        "Token",
        "tokens",
        ("token", "tok"),
        (("ID", "id"), ("NAME", "name"), ("PREFIX", "prefix"), ("TENANT", "tenant"), ("STATE", "state")),
        (("USER", "user"), ("ROLE", "role"), ("EXPIRES", "expires_at"), ("LAST_USED", "last_used_at")),
        declarative=False,
        path="/tokens/",
    ),
)


def kind_info(word: str) -> KindInfo:
    lowered = word.lower()
    for kind in KINDS:
        if lowered in (kind.name.lower(), kind.plural, *kind.aliases):
            return kind
    names = ", ".join(kind.plural for kind in KINDS)
    raise CliError(f"no kind {word!r}; the kinds are {names} (or their short names: whalegen get --help)", 2)


def value_at(item: dict[str, Any], path: str) -> Any:
    if path == "key":
        return object_key(item)
    value: Any = item
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def object_key(document: dict[str, Any]) -> str:
    """A document's key, as apply and the API name it: its identity values joined by "/"."""
    metadata = dict(document.get("metadata") or {})
    metadata.pop("labels", None)
    metadata.pop("annotations", None)
    return "/".join(str(value) for value in metadata.values())


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return " ".join(cell(item) for item in value) or "-"
    return str(value)


def table(rows: list[dict[str, Any]], columns: tuple[Column, ...]) -> list[str]:
    cells = [[cell(value_at(row, path)) for _, path in columns] for row in rows]
    widths = [max([len(header), *(len(r[i]) for r in cells)]) for i, (header, _) in enumerate(columns)]
    lines = ["   ".join(header.ljust(widths[i]) for i, (header, _) in enumerate(columns)).rstrip()]
    lines += ["   ".join(text.ljust(widths[i]) for i, text in enumerate(r)).rstrip() for r in cells]
    return lines


def parse_selector(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"-l {text!r}: write key=value[,key=value]", EXIT_INVALID)
        out[key.strip()] = value.strip()
    return out


def fetch(client: Client, kind: KindInfo, name: str | None, selector: dict[str, str]) -> list[dict[str, Any]]:
    """The objects of `kind` the token may see (the one named, when a name is given)."""
    if kind.declarative:
        params: dict[str, str] = {}
        if name:
            params["name"] = name
        if selector:
            params["selector"] = ",".join(f"{k}={v}" for k, v in selector.items())
        return list(client.call("GET", f"/objects/{kind.plural}/", params=params)["items"])
    if name:
        if not name.isdigit():
            raise CliError(f"{kind.plural} are named by their id (a number), not {name!r}", EXIT_INVALID)
        return [client.call("GET", f"{kind.path}{name}/")]
    rows: list[dict[str, Any]] = []
    while True:  # every page: a fleet's GPUs run to thousands
        page = client.call("GET", kind.path, params={"limit": 1000, "offset": len(rows)})
        rows += page["results"]
        if not page["results"] or len(rows) >= page["count"]:
            return rows
