"""Reads for queues, quotas and tasks, always through what the caller may see.

Objects of tenants the caller cannot see are simply absent: a detail read answers 404, never 403,
so nobody learns that another tenant's task 1234 exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, F, Func, IntegerField, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404

from apps.tenants.selectors import Access
from apps.workloads.models import Queue, Quota, Task, TaskEvent
from apps.workloads.state_machine import FINAL

# The states whose tasks hold quota: admission charges a task, its end or return to pending gives it back.
HOLDING = (Task.State.ADMITTED, Task.State.ASSIGNED, Task.State.RUNNING)


def _visible(queryset: QuerySet, access: Access, tenant_field: str = "tenant_id") -> QuerySet:
    if access.platform_admin:
        return queryset
    return queryset.filter(**{f"{tenant_field}__in": access.tenant_ids})


def task_list(*, access: Access) -> QuerySet[Task]:
    related = ("tenant", "queue", "pool", "submitted_by", "forecast", "wait")
    return _visible(Task.objects.select_related(*related), access)


def task_get(*, access: Access, task_id: int) -> Task:
    task = task_list(access=access).filter(pk=task_id).first()
    if task is None:
        raise Http404(f"no task {task_id}")
    return task


def task_events(*, task: Task) -> QuerySet[TaskEvent]:
    return TaskEvent.objects.filter(task=task)


def queue_list(*, access: Access) -> QuerySet[Queue]:
    return _visible(Queue.objects.select_related("tenant", "pool"), access)


def queue_get(*, access: Access, queue_id: int) -> Queue:
    queue = queue_list(access=access).filter(pk=queue_id).first()
    if queue is None:
        raise Http404(f"no queue {queue_id}")
    return queue


def quotas_with_waiting(quotas: QuerySet[Quota]) -> QuerySet[Quota]:
    """`quotas` annotated with `waiting_milli`: what the quota's tenant's pending tasks in its pool ask,
    all their GPUs together (they hold nothing until admitted). The one definition of it, for the quota
    list and for /metrics: a subquery per quota, answered from the tasks' (tenant, state) index, so it
    reads the tenant's pending tasks and never the pool's finished history.

    The sum is a plain SQL function, not Django's `Sum`, and the COALESCE is inside the subquery: an
    aggregate would make Django group the subquery (no row, so NULL, for a tenant with nothing pending),
    and a COALESCE around it would become a GROUP BY key of the quota list's own aggregate, which
    PostgreSQL computes for every joined task row, not once per quota (10 quotas, 250 tasks, analysed:
    7 against 0.8 ms of execution, and a plan costly enough to be JIT-compiled, 46 against 4 ms a call)."""
    asked = Func(F("gpu_count") * F("gpu_milli"), function="SUM")
    waiting = (
        Task.objects.filter(
            tenant_id=OuterRef("tenant_id"), pool_id=OuterRef("pool_id"), state=Task.State.PENDING
        )
        .order_by()
        .annotate(milli=Coalesce(asked, 0, output_field=IntegerField()))
        .values("milli")
    )
    return quotas.annotate(waiting_milli=Subquery(waiting, output_field=IntegerField()))


def _quota_tasks(*, states: tuple[str, ...], value: Func) -> Subquery:
    """One figure over the quota's tenant's tasks in its pool in `states`, as a subquery per quota.

    Answered from the tasks' (tenant, state) index, so it reads the tenant's tasks in those states and
    never the pool's finished history. As in `quotas_with_waiting`, the aggregate is a plain SQL function
    with its COALESCE inside: Django's `Sum` or `Count` would make it group the subquery (no row, so
    NULL, for a quota with no such task) and the outer query would need a GROUP BY again."""
    tasks = (
        Task.objects.filter(tenant_id=OuterRef("tenant_id"), pool_id=OuterRef("pool_id"), state__in=states)
        .order_by()
        .annotate(figure=Coalesce(value, 0, output_field=IntegerField()))
        .values("figure")
    )
    return Subquery(tasks, output_field=IntegerField())


def quota_list(*, access: Access) -> QuerySet[Quota]:
    """Quotas with their use: what admitted work holds (admitted, assigned, running: what the limit
    counts), what waiting work asks (it holds nothing: `quotas_with_waiting`), and how many tasks each is.

    Every figure is a subquery per quota over the tenant's tasks in the states it counts, not an aggregate
    over the pool's tasks joined in: that join read every finished task of every pool, so a long history
    made the list slow (160 quotas, 84,000 tasks, 80,000 of them finished: seconds a call) while the
    answer depends only on the live tasks."""
    asked_milli = Func(F("gpu_count") * F("gpu_milli"), function="SUM")
    asked_mem_mib = Func(F("gpu_count") * Coalesce(F("gpu_mem_mib"), 0), function="SUM")
    tasks = Func(F("pk"), function="COUNT")
    return _visible(
        quotas_with_waiting(Quota.objects.select_related("tenant", "pool"))
        .annotate(
            held_milli=_quota_tasks(states=HOLDING, value=asked_milli),
            held_mem_mib=_quota_tasks(states=HOLDING, value=asked_mem_mib),
            tasks_pending=_quota_tasks(states=(Task.State.PENDING,), value=tasks),
            tasks_admitted=_quota_tasks(states=HOLDING, value=tasks),
        )
        # Named here rather than left to Meta.ordering, so the list's order is stated where it is read.
        .order_by("tenant__slug", "pool__name"),
        access,
    )


def quota_live_tasks(quota: Quota) -> int:
    """The tenant's tasks in the quota's pool that have not ended (pending ones included)."""
    return Task.objects.filter(tenant=quota.tenant_id, pool=quota.pool_id).exclude(state__in=FINAL).count()


def quota_get(*, access: Access, quota_id: int) -> Quota:
    quota = quota_list(access=access).filter(pk=quota_id).first()
    if quota is None:
        raise Http404(f"no quota {quota_id}")
    return quota


def queue_list_with_counts(*, access: Access) -> QuerySet[Queue]:
    """Queues with what waits and what runs in each, and when the oldest waiting task was submitted.

    `tasks_placed` counts tasks holding units but not yet started (admitted, assigned): the dashboard
    shows them apart from running ones so a slow agent start is visible.
    """
    placed = [Task.State.ADMITTED, Task.State.ASSIGNED]
    return (
        queue_list(access=access)
        .annotate(
            tasks_pending=Count("tasks", filter=Q(tasks__state=Task.State.PENDING)),
            tasks_placed=Count("tasks", filter=Q(tasks__state__in=placed)),
            tasks_running=Count("tasks", filter=Q(tasks__state=Task.State.RUNNING)),
            oldest_pending_at=Min("tasks__created_at", filter=Q(tasks__state=Task.State.PENDING)),
        )
        .order_by("tenant__slug", "name")
    )  # Meta.ordering is left out of GROUP BY queries


@dataclass(frozen=True)
class OnlineDemand:
    """A pool's online tasks, as its online reserve is sized from them (whalegen.forecast.online_reserve)."""

    arrival_milli: tuple[int, ...]  # what each online task submitted in the window asks, all GPUs together
    holding: frozenset[str]  # online tasks assigned or running now (engine task ids)


def pool_online_demand(*, pool_id: int, since: datetime, until: datetime) -> OnlineDemand:
    """The pool's online tasks submitted in (since, until], and those holding units now: one query."""
    holding_states = (Task.State.ASSIGNED, Task.State.RUNNING)
    rows = (
        Task.objects.filter(pool_id=pool_id, sla_class=Task.SlaClass.ONLINE)
        .filter(Q(created_at__gt=since, created_at__lte=until) | Q(state__in=holding_states))
        .order_by()
        .values_list("id", "created_at", "state", "gpu_count", "gpu_milli")
    )
    arrivals: list[int] = []
    holding: set[str] = set()
    for pk, created_at, state, gpu_count, gpu_milli in rows:
        if since < created_at <= until:
            arrivals.append(gpu_count * gpu_milli)
        if state in holding_states:
            holding.add(str(pk))
    return OnlineDemand(tuple(arrivals), frozenset(holding))
