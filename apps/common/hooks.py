"""The one seam where a lower app reaches a higher one (docs/architecture.md, "Hooks").

Apps import each other only downward, in `apps.LAYERS`. A few writes and reads of a lower app must still
reach an app above it: a cycle that re-carves a GPU must have accounting keep what the deleted units held
and the node's agent see the new layout; a submitted task must be forecast. For each such call the lower
app calls a hook named here, and the higher app registers its function in its `AppConfig.ready`. Every
hook has exactly one function; calling a hook nobody registered raises (every app is installed, so that is
a wiring bug, never a case to skip quietly).

This module names the calls, so the whole list of upward calls is read in one place; it imports no app.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from django.db.models import QuerySet

from whalegen.placement.types import BudgetSpent
from whalegen.scheduling.precarve import ShapeForecast

P = ParamSpec("P")
R = TypeVar("R")


class Hook(Generic[P, R]):
    """A call from a lower app to the one function a higher app (`registered_by`) registered for it."""

    def __init__(self, name: str, registered_by: str) -> None:
        self.name = name
        self.registered_by = registered_by
        self._function: Callable[P, R] | None = None

    def register(self, function: Callable[P, R]) -> None:
        # AppConfig.ready may run again in one process (a test re-initialising apps): the same function
        # again is fine, a second one is a wiring bug.
        if self._function is not None and self._function is not function:
            raise RuntimeError(f"hook {self.name} already has {self._function!r}")
        self._function = function

    @property
    def registered(self) -> bool:
        return self._function is not None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._function is None:
            raise RuntimeError(
                f"hook {self.name}: apps.{self.registered_by} registered nothing (is it installed?)"
            )
        return self._function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Hook({self.name!r}, registered_by={self.registered_by!r})"


# Called by workloads (cancel, preemption) and scheduling (commit, re-carve) inside the transaction that
# changes what the nodes must run; fleet moves each node's desired-state mark once it commits.
# Registered: apps.fleet.changes.node_changed.
nodes_changed: Hook[[Iterable[int]], None] = Hook("nodes_changed", "fleet")

# Called by scheduling after it re-carved a GPU of `node`: the node's desired-state generation, raised if
# the content changed, which the agent reports back once it applied the layout.
# Registered: apps.fleet.agents.desired_generation.
desired_generation: Hook[..., int] = Hook("desired_generation", "fleet")

# Called by scheduling, keyword `gpu_id`, before a re-carve deletes the GPU's units: accounting copies what
# finished assignments held on them, so usage does not shrink.
# Registered: apps.accounting.services.held_units_keep.
gpu_units_deleting: Hook[..., int] = Hook("gpu_units_deleting", "accounting")

# Called by the scheduling snapshot (keywords pool_id, limits, now): tenant id → its spent budget this
# month. Registered: apps.accounting.selectors.budgets_spent.
budgets_spent: Hook[..., Mapping[int, BudgetSpent]] = Hook("budgets_spent", "accounting")

# Called by accounting when it prices usage: GPU model → price per GPU-hour applied with `whalegen apply`
# (they win over WHALEGEN_GPU_PRICES). Registered: apps.declarative.selectors.gpu_prices_applied.
gpu_prices_applied: Hook[[], Mapping[str, float]] = Hook("gpu_prices_applied", "declarative")

# Called by workloads once per submitted batch (keyword task_ids), inside the submission's transaction:
# forecasting attaches forecasts after it commits. Registered:
# apps.forecasting.services.tasks_forecast_attach_on_commit.
tasks_submitted: Hook[..., None] = Hook("tasks_submitted", "forecasting")

# Called by fleet for an agent report's output chunks: first to check the node may write them (keywords
# node, chunks, reported; raises NotAllowed), then, inside the report's transaction, to store them
# (keywords node, chunks). Registered: apps.logs.services.log_chunks_check and log_chunks_store.
agent_logs_check: Hook[..., None] = Hook("agent_logs_check", "logs")
agent_logs_store: Hook[..., int] = Hook("agent_logs_store", "logs")

# Called by the scheduling snapshot (keywords pool_id, now): a query of the unit ids of assignments released
# lately whose task's process on that node may still run, whose GPUs are never re-carved under it.
# Registered: apps.fleet.selectors.stopping_unit_rows.
stopping_unit_rows: Hook[..., QuerySet[Any]] = Hook("stopping_unit_rows", "fleet")

# Called by inventory's GPU list and compute-unit admin: the units queryset annotated with `holder_id` and
# `holder_tenant_id` (the task whose live assignment lists the unit). Registered:
# apps.scheduling.holders.with_holders.
units_with_holders: Hook[..., QuerySet[Any]] = Hook("units_with_holders", "scheduling")

# Called by the scheduling cycle's input (keywords pool_id, now): the shape mix placement weighs
# fragmentation with (an apps.scheduling.snapshot.pool.PoolShapeMix), from the pool's active arrivals
# model when it has one. Registered: apps.forecasting.selectors.pool_shape_mix.
pool_shape_mix: Hook[..., Any] = Hook("pool_shape_mix", "forecasting")

# Called by the scheduling cycle's input when pre-carving is on (keywords pool_id, now): the pool's
# arrivals forecast by shape, or None. Registered: apps.forecasting.selectors.pool_shape_forecast.
pool_shape_forecast: Hook[..., ShapeForecast | None] = Hook("pool_shape_forecast", "forecasting")

ALL: tuple[Hook[..., Any], ...] = (
    nodes_changed,
    desired_generation,
    gpu_units_deleting,
    budgets_spent,
    gpu_prices_applied,
    tasks_submitted,
    agent_logs_check,
    agent_logs_store,
    stopping_unit_rows,
    units_with_holders,
    pool_shape_mix,
    pool_shape_forecast,
)
