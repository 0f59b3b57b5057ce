"""Figures the templates draw: quota bars, the GPU heat-map and a task's run (command, output tail).
They take what selectors returned and compute sizes and positions, so templates only place them and
hold no arithmetic."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from html import escape  # what Django's escape does, without its lazy-string wrapper (8,000 calls a map)
from math import ceil
from shlex import join as shell_join
from typing import Any

from apps.inventory.models import ComputeUnit
from apps.scheduling.selectors import QuotaUsage
from apps.workloads.models import Quota
from whalegen.gpus.mig import MEMORY_SLICES, mig_profiles


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


@dataclass(frozen=True)
class QuotaBar:
    """One quota drawn as a bar scaled to its limit (guarantee + borrow limit): what is in use inside
    the guarantee, what is borrowed beyond it, and a tick where the guarantee ends."""

    quota: Quota
    in_use_milli: int
    admitted_borrowed_milli: int  # held by tasks admitted as borrowed (see QuotaUsage)

    @property
    def reclaimable_milli(self) -> int:
        """What an owner within its guarantee may take back: tasks admitted as borrowed, but only while
        the tenant holds more than its guarantee (the scheduler's reclaim rule, whalegen.placement.engine)."""
        return self.admitted_borrowed_milli if self.in_use_milli > self.quota.guaranteed_milli else 0

    @property
    def borrowed_milli(self) -> int:
        return max(self.in_use_milli - self.quota.guaranteed_milli, 0)

    @property
    def scale_milli(self) -> int:
        # Never below what is in use: a quota lowered under running work still shows all of it.
        return max(self.quota.limit_milli, self.requested_milli, 1)

    @property
    def within_pct(self) -> float:
        return _pct(self.in_use_milli - self.borrowed_milli, self.scale_milli)

    @property
    def borrowed_pct(self) -> float:
        return _pct(self.borrowed_milli, self.scale_milli)

    @property
    def guaranteed_pct(self) -> float:
        return _pct(self.quota.guaranteed_milli, self.scale_milli)

    @property
    def requested_milli(self) -> int:
        """What is held plus what waiting tasks ask (they hold nothing until admitted)."""
        return self.in_use_milli + getattr(self.quota, "waiting_milli", 0)

    @property
    def requested_pct(self) -> float:
        """Held and waiting together: drawn as an outline behind the bar."""
        return _pct(self.requested_milli, self.scale_milli)


def quota_bars(quotas: Iterable[Quota], usage: dict[tuple[int, int], QuotaUsage]) -> list[QuotaBar]:
    bars = []
    for quota in quotas:
        used = usage.get((quota.tenant_id, quota.pool_id), QuotaUsage())
        bars.append(
            QuotaBar(
                quota=quota, in_use_milli=used.in_use_milli, admitted_borrowed_milli=used.reclaimable_milli
            )
        )
    return bars


def age_s(since: datetime | None, now: datetime) -> float | None:
    return None if since is None else max((now - since).total_seconds(), 0.0)


# Heat-map geometry, in SVG user units (pixels at 100 % zoom).
LABEL_W = 170
HEADER_H = 22
CELL_W = 104
CELL_H = 54
GAP = 6
STRIP_H = 14  # the partition strip at the bottom of each cell
PAD = 5


@dataclass(frozen=True)
class Segment:
    """One compute unit inside a GPU's cell, placed where it sits on the GPU."""

    x: float
    y: float
    width: float
    height: float
    kind: str
    label: str
    held: bool
    task_id: int | None  # only when the viewer may see the task

    @property
    def title(self) -> str:
        holder = f"task {self.task_id}" if self.task_id else ("in use" if self.held else "free")
        return f"{self.label}: {holder}"


@dataclass(frozen=True)
class Cell:
    x: float
    y: float
    index: int
    model: str
    partition_mode: str
    health: str
    allocated_milli: int
    segments: tuple[Segment, ...]

    @property
    def heat(self) -> int:
        """0 = idle, 1..4 = up to a quarter, half, three quarters, all of the GPU allocated."""
        return min(4, ceil(self.allocated_milli / 250))

    @property
    def allocated_pct(self) -> int:
        return round(self.allocated_milli / 10)

    @property
    def title(self) -> str:
        return (
            f"GPU {self.index} · {self.model} · {self.partition_mode} · {self.health} · "
            f"{self.allocated_milli}/1000 milli allocated"
        )


@dataclass(frozen=True)
class Row:
    y: float
    node: str
    state: str
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class HeatMap:
    rows: tuple[Row, ...]
    columns: tuple[tuple[int, float], ...]  # (GPU index, x of its column)
    width: float
    height: float
    gpus: int
    allocated_milli: int
    cell_w: int = CELL_W
    cell_h: int = CELL_H


_KIND_LABELS = {kind.value: str(kind.label) for kind in ComputeUnit.Kind}


def _unit_span(unit: Any, model: str, cursor: float) -> tuple[float, float]:
    """(start, width) of a unit as fractions of the GPU. MIG instances sit on their memory slices;
    other units are laid side by side in the order they were carved."""
    if unit.kind == ComputeUnit.Kind.MIG and unit.mig_start is not None:
        profile = next((p for p in mig_profiles(model) if p.name == unit.mig_profile), None)
        if profile is not None:
            return unit.mig_start / MEMORY_SLICES, profile.memory_slices / MEMORY_SLICES
    return cursor, unit.gpu_milli / 1000


def heat_map(gpus: Iterable[Any], visible_tenant_ids: set[int] | None) -> HeatMap:
    """Nodes as rows, GPU indices as columns, from `history.heat_map_gpus` (in node order).
    `visible_tenant_ids` None = every task id may be shown; otherwise another tenant's work shows as
    "in use", never by id."""
    by_node: dict[int, list[Any]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    indices = sorted({gpu.index for node_gpus in by_node.values() for gpu in node_gpus})
    column_x = {index: LABEL_W + i * (CELL_W + GAP) for i, index in enumerate(indices)}
    rows: list[Row] = []
    total = 0
    strip_w = CELL_W - 2 * PAD
    for r, node_gpus in enumerate(by_node.values()):
        y = HEADER_H + r * (CELL_H + GAP)
        strip_y = y + CELL_H - PAD - STRIP_H
        cells = []
        for gpu in sorted(node_gpus, key=lambda g: g.index):
            x = column_x[gpu.index]
            segments = []
            cursor = 0.0
            allocated = 0
            for unit in gpu.units:
                start, width = _unit_span(unit, gpu.model, cursor)
                cursor = start + width
                held = unit.task_id is not None
                allocated += unit.gpu_milli if held else 0
                may_see = visible_tenant_ids is None or unit.tenant_id in visible_tenant_ids
                label = unit.mig_profile or f"{_KIND_LABELS.get(unit.kind, unit.kind)} {unit.gpu_milli}‰"
                segments.append(
                    Segment(
                        x=x + PAD + start * strip_w,
                        y=strip_y,
                        width=max(width * strip_w - 1, 1),
                        height=STRIP_H,
                        kind=unit.kind,
                        label=label,
                        held=held,
                        task_id=unit.task_id if held and may_see else None,
                    )
                )
            total += allocated
            cells.append(
                Cell(
                    x=x,
                    y=y,
                    index=gpu.index,
                    model=gpu.model,
                    partition_mode=gpu.partition_mode,
                    health=gpu.health,
                    allocated_milli=min(allocated, 1000),
                    segments=tuple(segments),
                )
            )
        first = node_gpus[0]
        rows.append(Row(y=y, node=first.node, state=first.node_state, cells=tuple(cells)))
    width = LABEL_W + max(len(indices), 1) * (CELL_W + GAP)
    height = HEADER_H + max(len(rows), 1) * (CELL_H + GAP)
    return HeatMap(
        rows=tuple(rows),
        columns=tuple((index, column_x[index]) for index in indices),
        width=width,
        height=height,
        gpus=sum(len(g) for g in by_node.values()),
        allocated_milli=total,
    )


@dataclass(frozen=True)
class RunView:
    """What a person debugging a task wants first: what ran, how it ended, why, and its last output.
    Environment values are left out on purpose (they often hold secrets); their keys are shown."""

    command: str
    env_keys: list[str]
    exit_code: int | None
    failure_reason: str
    attempt: int
    attempts: list[int]
    tail: list[dict[str, Any]]
    next_offset: int
    complete: bool
    from_first_line: bool = False  # the tail starts at the run's first line: it is all the output

    @property
    def tail_note(self) -> str:
        """What the output box holds, in words: all of it ("1 line", not "the last 1 lines"), or its end."""
        count = len(self.tail)
        if not count:
            return "No output yet"
        if self.from_first_line:
            return "All of the output (1 line)" if count == 1 else f"All of the output ({count} lines)"
        return "The last line" if count == 1 else f"The last {count} lines"


def run_view(
    *, command: list[str], env: dict[str, str], exit_code: int | None, failure_reason: str, page: Any
) -> RunView:
    return RunView(
        command=shell_join(command) if command else "",
        env_keys=sorted(env),
        exit_code=exit_code,
        failure_reason=failure_reason,
        attempt=page.attempt,
        attempts=page.attempts,
        tail=page.lines,
        next_offset=page.next_offset,
        complete=page.complete,
        from_first_line=page.offset == 0,
    )


def one_line(reason: str, limit: int = 120) -> str:
    """A reason as one line of a table cell: the first line, shortened with an ellipsis."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


# ------------------------------------------------------------------------------------------ fleet overview


@dataclass
class FleetPool:
    """One pool as the fleet overview shows it: capacity, what is held, and what waits and why."""

    pool_id: int
    name: str
    clusters: list[str] = field(default_factory=list)
    gpus: int = 0
    capacity_milli: int = 0
    allocated_milli: int = 0
    unhealthy_gpus: int = 0
    nodes: dict[str, int] = field(default_factory=dict)  # node state → count
    pending: list[tuple[str, int]] = field(default_factory=list)  # (why-pending code, tasks), largest first
    pending_total: int = 0
    oldest_pending_at: datetime | None = None
    fragmented_pct: float | None = None  # of capacity, after the pool's latest cycle
    last_cycle_at: datetime | None = None

    @property
    def idle_milli(self) -> int:
        return self.capacity_milli - self.allocated_milli

    @property
    def allocated_pct(self) -> float:
        return _pct(self.allocated_milli, self.capacity_milli)

    @property
    def idle_while_pending(self) -> bool:
        """Free capacity and waiting work at once: the first thing an operator looks into."""
        return self.idle_milli > 0 and self.pending_total > 0


@dataclass
class FleetCluster:
    """One cluster's part of one pool (a pool may span clusters)."""

    cluster: str
    pool: str
    pool_id: int
    cordoned: bool = False
    gpus: int = 0
    capacity_milli: int = 0
    allocated_milli: int = 0
    nodes: dict[str, int] = field(default_factory=dict)

    @property
    def allocated_pct(self) -> float:
        return _pct(self.allocated_milli, self.capacity_milli)


@dataclass(frozen=True)
class FleetView:
    pools: list[FleetPool]
    clusters: list[FleetCluster]

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def allocated_milli(self) -> int:
        return sum(p.allocated_milli for p in self.pools)

    @property
    def capacity_milli(self) -> int:
        return sum(p.capacity_milli for p in self.pools)

    @property
    def allocated_pct(self) -> float:
        return _pct(self.allocated_milli, self.capacity_milli)

    @property
    def pending_total(self) -> int:
        return sum(p.pending_total for p in self.pools)

    @property
    def nodes_not_ready(self) -> int:
        return sum(n for p in self.pools for state, n in p.nodes.items() if state != "ready")


def fleet_view(readings: Any) -> FleetView:
    """The fleet overview from `apps.metrics.selectors.fleet_readings` (six grouped queries).

    Capacity is 1000 milli per GPU (a MIG GPU not fully carved still counts whole: its uncarved slices
    are capacity nobody can use until it is re-carved); allocation is the sum of the held units' milli.
    """
    by_name = sorted(readings.pools.items(), key=lambda kv: kv[1])
    pools = {pid: FleetPool(pool_id=pid, name=name) for pid, name in by_name}
    clusters: dict[tuple[str, int], FleetCluster] = {}

    def part(cluster: str, pool_id: int) -> FleetCluster:
        key = (cluster, pool_id)
        if key not in clusters:
            clusters[key] = FleetCluster(cluster=cluster, pool=pools[pool_id].name, pool_id=pool_id)
        return clusters[key]

    for row in readings.gpus:
        pool = pools[row["pool_id"]]
        piece = part(row["cluster"], row["pool_id"])
        pool.gpus += row["gpus"]
        piece.gpus += row["gpus"]
        pool.capacity_milli += 1000 * row["gpus"]
        piece.capacity_milli += 1000 * row["gpus"]
        if row["health"] != "healthy":
            pool.unhealthy_gpus += row["gpus"]
    for row in readings.units:
        pool = pools[row["pool_id"]]
        pool.allocated_milli += row["held_milli"] or 0
        piece = part(row["cluster"], row["pool_id"])
        piece.allocated_milli += row["held_milli"] or 0
    for row in readings.nodes:
        pool = pools[row["pool_id"]]
        pool.nodes[row["state"]] = pool.nodes.get(row["state"], 0) + row["nodes"]
        piece = part(row["cluster_name"], row["pool_id"])
        piece.nodes[row["state"]] = piece.nodes.get(row["state"], 0) + row["nodes"]
        piece.cordoned = bool(row["cordoned"])
    for row in readings.pending:
        pool = pools[row["pool_id"]]
        pool.pending.append((row["why_pending_code"] or "", row["tasks"]))
        pool.pending_total += row["tasks"]
        if pool.oldest_pending_at is None or row["oldest"] < pool.oldest_pending_at:
            pool.oldest_pending_at = row["oldest"]
    for row in readings.latest_cycles:
        pool = pools[row["pool_id"]]
        pool.last_cycle_at = row["started_at"]
        after = (row["stats"] or {}).get("fragmentation_after") or {}
        pool.fragmented_pct = after.get("amount_pct")
    for pool in pools.values():
        pool.pending.sort(key=lambda item: (-item[1], item[0]))
        pool.clusters = sorted(c.cluster for c in clusters.values() if c.pool_id == pool.pool_id)
    ordered = sorted(clusters.values(), key=lambda c: (c.cluster, c.pool))
    return FleetView(pools=list(pools.values()), clusters=ordered)


# ----------------------------------------------------------------------------------------------- what-if

OTHER_TENANT = "another tenant's task"


@dataclass(frozen=True)
class WhatIfRow:
    task_id: str
    name: str
    where: str  # "node GPU 0,1: whole 1000" for a placement; the reason's code for a wait
    detail: str  # the units, or the reason's sentence (blank for another tenant's task)


@dataclass(frozen=True)
class WhatIfRun:
    policy: str
    placed: list[WhatIfRow]  # the first `rows` placements
    waiting: list[WhatIfRow]  # the first `rows` waits, by task id
    preempted: int
    layouts: list[str]
    frag_before_pct: float
    frag_after_pct: float
    placed_total: int = 0
    waiting_total: int = 0
    waiting_by_reason: tuple[tuple[str, int], ...] = ()  # (code, tasks), largest first: every wait

    @property
    def placed_more(self) -> int:
        return self.placed_total - len(self.placed)

    @property
    def waiting_more(self) -> int:
        return self.waiting_total - len(self.waiting)


def whatif_runs(summary: dict[str, Any], access: Any) -> list[WhatIfRun]:
    """The stored decision (`apps.dashboard.whatif.summary`) as the viewer may see it: a platform admin
    sees every name, a member their tenants' tasks only; another tenant's reasons are summarised, not
    quoted. No query: the summary carries each listed task's tenant."""
    names, tenants = summary["names"], summary["tenants"]
    own = None if access.platform_admin else set(access.tenant_ids)

    def name(task_id: str) -> str:
        if own is not None and tenants.get(task_id) not in own:
            return OTHER_TENANT
        return names.get(task_id, task_id)

    runs = []
    for run in summary["runs"]:
        placed = [WhatIfRow(t, name(t), where, detail) for t, where, detail in run["placed"]]
        waiting = []
        for t, code, message in run["waiting"]:
            shown = name(t)
            waiting.append(WhatIfRow(t, shown, code, "" if shown == OTHER_TENANT else message))
        runs.append(
            WhatIfRun(
                policy=run["policy"],
                placed=placed,
                waiting=waiting,
                preempted=run["preempted"],
                layouts=run["layouts"],
                frag_before_pct=run["frag_before_pct"],
                frag_after_pct=run["frag_after_pct"],
                placed_total=run["placed_total"],
                waiting_total=run["waiting_total"],
                waiting_by_reason=tuple((code, n) for code, n in run["waiting_by_reason"]),
            )
        )
    return runs


# ------------------------------------------------------------------------------------------------ charts

CHART_W, CHART_H = 560, 180
CHART_LEFT, CHART_RIGHT, CHART_TOP, CHART_BOTTOM = 48, 12, 10, 24


@dataclass(frozen=True)
class ChartLine:
    name: str
    css: str  # "line-1" … "line-5": colour and dash pattern (tell lines apart without colour too)
    segments: tuple[str, ...]  # SVG polyline points; a bucket without data breaks the line


@dataclass(frozen=True)
class Chart:
    """A line chart drawn server-side as SVG, with its numbers as a table (every chart has both)."""

    key: str
    title: str
    unit: str
    lines: tuple[ChartLine, ...]
    y_ticks: tuple[tuple[float, str], ...]  # (pixel y, label)
    x_ticks: tuple[tuple[float, str], ...]  # (pixel x, label)
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    width: int = CHART_W
    height: int = CHART_H
    empty: bool = False
    note: str = ""  # a sentence under the title: why a line is missing and when it comes


def _nice_max(value: float) -> float:
    """The smallest of 1, 2, 5 × 10^k at or above `value` (an axis that ends on a round number)."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * scale:
            return float(step * scale)
    return float(10 * scale)


def line_chart(
    *,
    key: str,
    title: str,
    unit: str,
    times: list[datetime],
    series: list[tuple[str, list[float | None]]],
    fmt: Any = None,
    y_max: float | None = None,
) -> Chart:
    """Lines over evenly spaced buckets starting at `times`; `fmt` writes a value for ticks and table."""
    fmt = fmt or (lambda v: f"{v:.1f}")
    values = [v for _, vs in series for v in vs if v is not None]
    top = y_max if y_max is not None else _nice_max(max(values, default=0.0))
    plot_w = CHART_W - CHART_LEFT - CHART_RIGHT
    plot_h = CHART_H - CHART_TOP - CHART_BOTTOM
    n = max(1, len(times) - 1)

    def x(i: int) -> float:
        return round(CHART_LEFT + plot_w * i / n, 1)

    def y(v: float) -> float:
        return round(CHART_TOP + plot_h * (1 - min(v, top) / top), 1)

    lines = []
    for number, (name, vs) in enumerate(series, start=1):
        segments, current = [], []
        for i, v in enumerate(vs):
            if v is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            current.append(f"{x(i)},{y(v)}")
        if current:
            segments.append(" ".join(current))
        # A lone point is drawn as a dot: the same point twice with round line caps.
        segments = [seg if " " in seg else f"{seg} {seg}" for seg in segments]
        lines.append(ChartLine(name=name, css=f"line-{number}", segments=tuple(segments)))
    y_ticks = tuple((y(top * f), fmt(top * f)) for f in (0.0, 0.5, 1.0))
    step = max(1, len(times) // 4)
    marks = sorted({*range(0, len(times), step), len(times) - 1})
    x_ticks = tuple((x(i), f"{times[i]:%H:%M}") for i in marks if times)
    rows = tuple(
        (f"{t:%Y-%m-%d %H:%M}", *("–" if vs[i] is None else fmt(vs[i]) for _, vs in series))
        for i, t in enumerate(times)
        if any(vs[i] is not None for _, vs in series)
    )
    return Chart(
        key=key,
        title=title,
        unit=unit,
        lines=tuple(lines),
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        head=("bucket start", *(name for name, _ in series)),
        rows=rows,
        empty=not values,
    )


def history_charts(history: Any) -> list[Chart]:
    """The pool history page's charts from `apps.dashboard.history.pool_history`."""
    from apps.dashboard.templatetags.dashboard import duration
    from apps.dashboard.words import reason_label

    b = history.buckets
    times = [bucket.start for bucket in b]
    pct = lambda v: f"{v:.1f}%"  # noqa: E731
    count = lambda v: f"{v:.3g}"  # noqa: E731 (0.05 stays 0.05 on a small axis, 12.5 stays 12.5)
    reasons = [
        (
            reason_label(code),
            [dict(x.pending_by_reason).get(code) if x.pending_by_reason else None for x in b],
        )
        for code in history.reasons
    ]
    return [
        line_chart(
            key="allocation",
            title="Allocated and busy",
            unit="% of the pool's GPUs",
            times=times,
            series=[
                ("allocated", [x.allocated_pct for x in b]),
                ("busy (SM utilisation)", [x.busy_pct for x in b]),
            ],
            fmt=pct,
            y_max=100.0,
        ),
        line_chart(
            key="fragmentation",
            title="Fragmented capacity",
            unit="% of capacity left in pieces the task mix cannot use",
            times=times,
            series=[("fragmented", [x.fragmented_pct for x in b])],
            fmt=pct,
        ),
        line_chart(
            key="pending",
            title="Pending tasks, by reason",
            unit="tasks left pending per cycle (mean over the bucket)",
            times=times,
            series=[("all pending", [x.pending for x in b]), *reasons],
            fmt=count,
        ),
        line_chart(
            key="tenants",
            title="GPUs held by tenant",
            unit="mean GPUs held over the bucket (guarantee in brackets)",
            times=times,
            series=[
                (f"{u.tenant} ({u.guaranteed_milli / 1000:g})", [m / 1000 for m in u.held_milli])
                for u in history.tenants
            ],
            fmt=lambda v: f"{v:.2f}",
        ),
        line_chart(
            key="wait",
            title="Queue wait of tasks that started",
            unit="submission to start",
            times=times,
            series=[("P50", [x.wait_p50_s for x in b]), ("P95", [x.wait_p95_s for x in b])],
            fmt=duration,
        ),
    ]


def arrivals_chart(arrivals: Any) -> Chart:
    """Submissions per bin beside the arrivals model's one-hour-ahead forecast (the next hour included)."""
    minutes = arrivals.bin_s // 60
    return _beside_chart(
        arrivals,
        key="arrivals",
        title="Submissions: actual and forecast",
        unit=f"tasks submitted per {minutes} minutes; the last 6 hours and the next",
        actual="submitted",
        forecast=f"forecast one hour ahead (model v{arrivals.model_version})",
    )


def idle_chart(idle: Any, note: str = "") -> Chart:
    """Idle GPUs per bin beside the idle-GPU model's one-hour-ahead forecast (the next hour included).
    Without a model, `note` says how much history the pool still needs and when forecasts can start
    (`history.idle_forecast_note`), in place of the generic reason."""
    minutes = idle.bin_s // 60
    if note and idle.model_version is None:
        idle = replace(idle, reason="")
    chart = _beside_chart(
        idle,
        key="idle",
        title="Idle GPUs: actual and forecast",
        unit=f"idle GPUs before each cycle placed, mean per {minutes} minutes; the last 6 hours and the next",
        actual="idle",
        forecast=f"forecast {idle.horizon_s // 60} min ahead (model v{idle.model_version})",
    )
    return replace(chart, note=note) if idle.model_version is None else chart


def _beside_chart(beside: Any, *, key: str, title: str, unit: str, actual: str, forecast: str) -> Chart:
    """What happened per bin and what a model forecast for it; without a model the line is "forecast" and
    the unit says why."""
    if beside.reason:
        unit += f" — {beside.reason}"
    return line_chart(
        key=key,
        title=title,
        unit=unit,
        times=list(beside.starts),
        series=[
            (actual, list(beside.actual)),
            (forecast if beside.model_version else "forecast", list(beside.forecast)),
        ],
        fmt=lambda v: f"{v:.1f}",
    )


def heat_map_svg(drawn: HeatMap, pool_name: str) -> str:
    """The heat-map's SVG markup, written here rather than by the template: a page of 100 nodes is 800
    cells and thousands of unit segments, and Django's template engine spent about half a second of CPU
    resolving their ~25,000 variables (benchmarks/dashboard_pages.py); string formatting takes a tenth of
    that. Every text that comes from the database or a user is escaped."""
    out = [
        f'<svg class="heatmap" id="heatmap" width="{drawn.width}" height="{drawn.height}" '
        f'viewBox="0 0 {drawn.width} {drawn.height}" role="img" '
        f'aria-label="GPU allocation of pool {escape(pool_name)}, nodes by GPU index">'
    ]
    out += [f'<text class="col" x="{x}" y="14">GPU {index}</text>' for index, x in drawn.columns]
    for row in drawn.rows:
        state = escape(row.state)
        suffix = f" ({state})" if row.state != "ready" else ""
        out.append(
            f'<g class="node state-{state}"><text class="node-label" x="4" y="{int(row.y) + 30}">'
            f"{escape(row.node)}{suffix}</text>"
        )
        for cell in row.cells:
            x, y = int(cell.x), int(cell.y)
            out.append(
                f'<g class="gpu heat-{cell.heat} health-{escape(cell.health)}" '
                f'data-allocated="{cell.allocated_milli}"><title>{escape(cell.title)}</title>'
                f'<rect class="cell" x="{cell.x}" y="{cell.y}" width="{drawn.cell_w}" '
                f'height="{drawn.cell_h}" rx="4"></rect>'
                f'<text class="model" x="{x + 5}" y="{y + 14}">{escape(cell.model)}</text>'
                f'<text class="alloc" x="{x + 5}" y="{y + 29}">{cell.allocated_pct}% · '
                f"{escape(cell.partition_mode)}</text>"
            )
            out += [
                f'<rect class="unit {escape(seg.kind)}{" held" if seg.held else ""}" x="{seg.x}" y="{seg.y}" '
                f'width="{seg.width}" height="{seg.height}"><title>{escape(seg.title)}</title></rect>'
                for seg in cell.segments
            ]
            out.append("</g>")
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
