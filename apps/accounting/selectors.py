"""GPU-hours (and money) per tenant, queue, pool and GPU model, computed in one grouped SQL query.

What is charged (docs/accounting.md): every assignment from its creation (the scheduler's commit binds
the units) until its release (finished, preempted, lost, cancelled), or until now while it holds its
units; an assignment is charged for what its units are, not for what the task asked:

- a whole GPU is 1;
- a MIG instance is its compute slices over the GPU's 7 (a 3g.40gb instance of an H100 80 GB is 3/7);
- an MPS share or a time slice is its `gpu_milli` / 1000 (a 300-milli MPS share is 0.3).

Units a re-carve deleted are read from `HeldUnit` (see there), so history survives re-carves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection

from apps.accounting.models import Budget, HeldUnit
from apps.common import hooks
from apps.inventory.models import ComputeUnit, Gpu, Pool
from apps.scheduling.fields import unit_ids_sql
from apps.scheduling.models import Assignment
from apps.tenants.models import Tenant
from apps.tenants.selectors import Access
from apps.workloads.models import Queue, Task
from whalegen.gpus.mig import COMPUTE_SLICES, MIG_TABLES
from whalegen.placement.types import BudgetSpent

# group name → the SQL expression it groups by. A queue is named with its tenant: names are per tenant.
GROUPS: dict[str, str] = {
    "tenant": "tn.slug",
    "queue": "tn.slug || '/' || q.name",
    "pool": "p.name",
    "gpu_model": "{model}",  # the GPU model column of the branch (see `_held_sources`)
}
# The scheduler's reader groups by tenant id (it knows tenants by id); not offered through the API.
_GROUP_SQL = {**GROUPS, "tenant_id": "t.tenant_id"}
SECONDS_PER_HOUR = 3600.0


def unit_fraction(*, kind: str, mig_profile: str, gpu_milli: int) -> float:
    """What holding one unit counts as, in GPUs (the same rule as the SQL in `_held_sql`)."""
    if kind == ComputeUnit.Kind.MIG:
        return int(mig_profile.split("g", 1)[0]) / COMPUTE_SLICES
    return gpu_milli / 1000.0


def _held_sources() -> list[tuple[str, str, str]]:
    """(joins from `a`, GPU model, fraction) for the two places an assignment's units are read from: the
    unit ids in its row, and the copies `HeldUnit` keeps of units a re-carve deleted.

    Two branches of a UNION ALL, each joined from the filtered assignments: a union of both sources joined
    afterwards makes PostgreSQL read every source row ever made, however narrow the range.
    """
    slices = sorted({p.compute_slices for table in MIG_TABLES.values() for p in table})
    # A MIG profile's name starts with its compute slices ("3g.40gb", "1g.10gb+me"); `%%` is a literal %.
    mig = " ".join(f"WHEN u.mig_profile LIKE '{n}g.%%' THEN {n}" for n in slices)
    units, gpus = ComputeUnit._meta.db_table, Gpu._meta.db_table
    # One row per id in the assignment's `unit_ids`; an id whose unit a re-carve deleted joins nothing
    # (its share is in `HeldUnit`), as a link row deleted with its unit used to.
    held, unit_id = unit_ids_sql("a.unit_ids", connection.vendor)
    live = (
        f"CROSS JOIN {held} JOIN {units} u ON u.id = {unit_id} JOIN {gpus} g ON g.id = u.gpu_id",
        "g.model",
        f"CASE WHEN u.kind = 'mig' THEN (CASE {mig} END) / {float(COMPUTE_SLICES)}"
        " ELSE u.gpu_milli / 1000.0 END",
    )
    kept = (f"JOIN {HeldUnit._meta.db_table} hu ON hu.assignment_id = a.id", "hu.gpu_model", "hu.fraction")
    return [live, kept]


def _overlap_s_sql() -> str:
    """Seconds of [created_at, released_at or end) inside [start, end); params: end, end, start."""
    if connection.vendor == "postgresql":
        return (
            "EXTRACT(EPOCH FROM (LEAST(COALESCE(a.released_at, %s::timestamptz), %s::timestamptz)"
            " - GREATEST(a.created_at, %s::timestamptz)))"
        )
    # The embedded SQLite keeps datetimes as ISO text in UTC: MIN/MAX compare them, julianday counts days.
    return "(julianday(MIN(COALESCE(a.released_at, %s), %s)) - julianday(MAX(a.created_at, %s))) * 86400.0"


@dataclass(frozen=True)
class UsageRow:
    keys: Mapping[str, str]  # group name → value (tenant slug, "tenant/queue", pool name, GPU model)
    gpu_hours: float
    tasks: int  # distinct tasks that held GPUs in the range
    cost: float | None = None  # None when no price is configured
    unpriced_gpu_hours: float = 0.0  # GPU-hours on models without a price (not in `cost`)


@dataclass(frozen=True)
class UsageReport:
    start: datetime
    end: datetime  # the range's end as asked; usage is counted up to min(end, now)
    group_by: tuple[str, ...]
    currency: str | None
    rows: tuple[UsageRow, ...] = ()
    total: UsageRow = field(default_factory=lambda: UsageRow({}, 0.0, 0))


@dataclass(frozen=True)
class Filters:
    tenants: Sequence[str] = ()
    queues: Sequence[str] = ()
    pools: Sequence[str] = ()
    gpu_models: Sequence[str] = ()
    tenant_ids: Sequence[int] | None = None  # None: every tenant (a platform admin)
    pool_ids: Sequence[int] = ()


def gpu_prices() -> dict[str, float]:
    """Price per GPU-hour by catalogue model: WHALEGEN_GPU_PRICES (parsed in settings), and over it every
    price applied as a GpuPrice document (`whalegen apply`; apps.declarative, through its hook)."""
    prices = dict(getattr(settings, "WHALEGEN_GPU_PRICES", {}))
    prices.update(hooks.gpu_prices_applied())
    return prices


def _in(column: str, values: Sequence[Any], where: list[str], params: list[Any]) -> None:
    if values:
        where.append(f"{column} IN ({', '.join(['%s'] * len(values))})")
        params.extend(values)


def _usage(
    *, start: datetime, end: datetime, group_by: Sequence[str], filters: Filters, prices: Mapping[str, float]
) -> tuple[list[UsageRow], UsageRow]:
    """Rows per group and the total, in one query (the total is the sum of the rows)."""
    if (filters.tenant_ids is not None and not filters.tenant_ids) or end <= start:
        return [], UsageRow({}, 0.0, 0)  # nobody to see, or a range that has not begun by now
    adapt = connection.ops.adapt_datetimefield_value
    branches = []
    params: list[Any] = []
    for joins, model, fraction in _held_sources():
        where = ["a.created_at < %s", "(a.released_at IS NULL OR a.released_at > %s)"]
        params_where: list[Any] = [adapt(end), adapt(start)]
        if filters.tenant_ids is not None:
            _in("t.tenant_id", list(filters.tenant_ids), where, params_where)
        _in("tn.slug", list(filters.tenants), where, params_where)
        _in("q.name", list(filters.queues), where, params_where)
        _in("p.name", list(filters.pools), where, params_where)
        _in("t.pool_id", list(filters.pool_ids), where, params_where)
        _in(model, list(filters.gpu_models), where, params_where)
        keys = [f"{_GROUP_SQL[name].format(model=model)} AS g{i}" for i, name in enumerate(group_by)]
        branches.append(
            f"SELECT {', '.join([*keys, 'a.task_id AS task_id', f'{model} AS gpu_model'])},"
            f" {fraction} * {_overlap_s_sql()} AS gpu_s"
            f" FROM {Assignment._meta.db_table} a {joins}"
            f" JOIN {Task._meta.db_table} t ON t.id = a.task_id"
            f" JOIN {Tenant._meta.db_table} tn ON tn.id = t.tenant_id"
            f" JOIN {Queue._meta.db_table} q ON q.id = t.queue_id"
            f" JOIN {Pool._meta.db_table} p ON p.id = t.pool_id"
            f" WHERE {' AND '.join(where)}"
        )
        params += [adapt(end), adapt(end), adapt(start), *params_where]
    inner = " UNION ALL ".join(branches)
    outer = ["SUM(x.gpu_s)", "COUNT(DISTINCT x.task_id)"]
    if prices:
        cases = " ".join("WHEN %s THEN %s" for _ in prices)
        outer.append(f"SUM(x.gpu_s * CASE x.gpu_model {cases} ELSE 0 END)")
        outer.append(
            f"SUM(CASE WHEN x.gpu_model IN ({', '.join(['%s'] * len(prices))}) THEN 0 ELSE x.gpu_s END)"
        )
    names = [f"x.g{i}" for i in range(len(group_by))]
    sql = f"SELECT {', '.join([*names, *outer])} FROM ({inner}) x"
    if names:
        sql += f" GROUP BY {', '.join(names)} ORDER BY {', '.join(names)}"
    outer_params: list[Any] = []
    if prices:
        for model, price in prices.items():
            outer_params += [model, price]
        outer_params += list(prices)
    with connection.cursor() as cursor:
        # The outer aggregates' placeholders come first in the text, then the inner query's.
        cursor.execute(sql, outer_params + params)
        fetched = cursor.fetchall()
    rows = []
    for row in fetched:
        n = len(group_by)
        if not row[n + 1]:
            continue  # no assignment at all (the one row of an ungrouped aggregate over nothing)
        gpu_s = float(row[n] or 0.0)
        rows.append(
            UsageRow(
                keys=dict(zip(group_by, (str(v) for v in row[:n]), strict=True)),
                gpu_hours=gpu_s / SECONDS_PER_HOUR,
                tasks=int(row[n + 1]),
                cost=float(row[n + 2] or 0.0) / SECONDS_PER_HOUR if prices else None,
                unpriced_gpu_hours=float(row[n + 3] or 0.0) / SECONDS_PER_HOUR if prices else 0.0,
            )
        )
    total = UsageRow(
        keys={},
        gpu_hours=sum(r.gpu_hours for r in rows),
        # A task that held GPUs of two models is in two gpu_model rows, and counted in both.
        tasks=sum(r.tasks for r in rows),
        cost=sum(r.cost or 0.0 for r in rows) if prices else None,
        unpriced_gpu_hours=sum(r.unpriced_gpu_hours for r in rows),
    )
    return rows, total


def usage_report(
    *,
    access: Access,
    start: datetime,
    end: datetime,
    now: datetime,
    group_by: Sequence[str] = (),
    tenants: Sequence[str] = (),
    queues: Sequence[str] = (),
    pools: Sequence[str] = (),
    gpu_models: Sequence[str] = (),
    prices: Mapping[str, float] | None = None,
) -> UsageReport:
    """GPU-hours in [start, end) of what the caller may see: their tenants (and those below), or all for
    a platform admin; an outsider sees nothing. Usage after `now` is not counted (it has not happened).
    `prices`: per GPU-hour by model, read here when not given (a caller making several reports reads
    them once)."""
    prices = gpu_prices() if prices is None else prices
    rows, total = _usage(
        start=start,
        end=min(end, now),
        group_by=group_by,
        filters=Filters(
            tenants=tenants,
            queues=queues,
            pools=pools,
            gpu_models=gpu_models,
            tenant_ids=None if access.platform_admin else access.tenant_ids,
        ),
        prices=prices,
    )
    return UsageReport(
        start=start,
        end=end,
        group_by=tuple(group_by),
        currency=settings.WHALEGEN_CURRENCY if prices else None,
        rows=tuple(rows),
        total=total,
    )


def month_start(moment: datetime) -> datetime:
    """The first instant of `moment`'s calendar month in UTC (budgets' and the dashboard's period)."""
    moment = moment.astimezone(UTC)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def previous_month_start(moment: datetime) -> datetime:
    first = month_start(moment)
    return (
        first.replace(year=first.year - 1, month=12)
        if first.month == 1
        else first.replace(month=first.month - 1)
    )


def budgets_spent(*, pool_id: int, limits: Mapping[int, float], now: datetime) -> dict[int, BudgetSpent]:
    """Tenant id → its spent budget in this pool this month, for the tenants in `limits` (tenant id →
    GPU-hours per month) whose usage has reached the limit. One query; none when `limits` is empty."""
    if not limits:
        return {}
    start = month_start(now)
    rows, _ = _usage(
        start=start,
        end=now,
        group_by=("tenant_id", "pool"),
        filters=Filters(tenant_ids=sorted(limits), pool_ids=[pool_id]),
        prices={},
    )
    used = {int(row.keys["tenant_id"]): (row.keys["pool"], row.gpu_hours) for row in rows}
    spent: dict[int, BudgetSpent] = {}
    for tenant_id, limit in limits.items():
        pool, gpu_hours = used.get(tenant_id, ("", 0.0))
        if gpu_hours >= limit:
            if not pool:  # a zero budget, spent before any use: the pool's name is not in the rows
                pool = Pool.objects.values_list("name", flat=True).get(pk=pool_id)
            spent[tenant_id] = BudgetSpent(
                pool=pool, period=f"{start:%B %Y}", limit_gpu_h=limit, used_gpu_h=gpu_hours
            )
    return spent


@dataclass(frozen=True)
class BudgetStatus:
    budget: Budget
    used_gpu_h: float

    @property
    def spent(self) -> bool:
        return self.used_gpu_h >= self.budget.gpu_hours


def budget_list(*, access: Access, now: datetime) -> list[BudgetStatus]:
    """Budgets the caller may see with this month's usage (one usage query for all of them)."""
    budgets = Budget.objects.select_related("quota__tenant", "quota__pool").prefetch_related("changes")
    if not access.platform_admin:
        budgets = budgets.filter(quota__tenant_id__in=access.tenant_ids)
    found = list(budgets)
    if not found:
        return []
    used = month_usage(tenant_ids=sorted({b.quota.tenant_id for b in found}), now=now)
    return [BudgetStatus(b, used.get((b.quota.tenant.slug, b.quota.pool.name), 0.0)) for b in found]


@dataclass(frozen=True)
class MonthsRow:
    tenant: str
    pool: str
    this_month_gpu_h: float
    last_month_gpu_h: float
    this_month_cost: float | None
    last_month_cost: float | None
    budget_gpu_h: float | None  # the monthly budget, None when there is none
    budget_spent: bool


def tenant_months(*, access: Access, now: datetime) -> list[MonthsRow]:
    """Per visible tenant × pool: this month so far against the whole of last month, with the budget."""
    this_start, last_start = month_start(now), previous_month_start(now)
    prices = gpu_prices()
    by = ("tenant", "pool")
    this = usage_report(access=access, start=this_start, end=now, now=now, group_by=by, prices=prices)
    last = usage_report(access=access, start=last_start, end=this_start, now=now, group_by=by, prices=prices)
    budgets = {
        (b.budget.quota.tenant.slug, b.budget.quota.pool.name): b for b in budget_list(access=access, now=now)
    }
    by_key: dict[tuple[str, str], list[UsageRow | None]] = {}
    for i, report in enumerate((this, last)):
        for row in report.rows:
            by_key.setdefault((row.keys["tenant"], row.keys["pool"]), [None, None])[i] = row
    for key in budgets:
        by_key.setdefault(key, [None, None])
    out = []
    for (tenant, pool), (now_row, last_row) in sorted(by_key.items()):
        budget = budgets.get((tenant, pool))
        out.append(
            MonthsRow(
                tenant=tenant,
                pool=pool,
                this_month_gpu_h=now_row.gpu_hours if now_row else 0.0,
                last_month_gpu_h=last_row.gpu_hours if last_row else 0.0,
                this_month_cost=now_row.cost if now_row else None,
                last_month_cost=last_row.cost if last_row else None,
                budget_gpu_h=budget.budget.gpu_hours if budget else None,
                budget_spent=budget.spent if budget else False,
            )
        )
    return out


def month_usage(*, tenant_ids: Sequence[int], now: datetime) -> dict[tuple[str, str], float]:
    """(tenant slug, pool name) → GPU-hours this calendar month so far, for these tenants (one query)."""
    rows, _ = _usage(
        start=month_start(now),
        end=now,
        group_by=("tenant", "pool"),
        filters=Filters(tenant_ids=list(tenant_ids)),
        prices={},
    )
    return {(r.keys["tenant"], r.keys["pool"]): r.gpu_hours for r in rows}
