"""Dashboard pages. Each view reads through the owning app's selectors and writes through its services;
what a caller may see is the same `Access` the API uses, so another tenant's object is a 404 here too.

Refusals carry the service's reason and its status (403 not allowed, 409 changed meanwhile), and
invalid forms come back with their messages and a 400, with what was typed kept in the fields.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from apps.accounting.selectors import month_start, previous_month_start, tenant_months
from apps.approvals import selectors as approvals
from apps.approvals import services as approval_services
from apps.approvals.models import PriorityOverride
from apps.common.errors import ApplicationError
from apps.dashboard import whatif
from apps.dashboard.forms import (
    CancelForm,
    DecisionForm,
    OverrideRequestForm,
    TaskFilterForm,
    TokenCreateForm,
)
from apps.dashboard.history import (
    heat_map_gpus,
    idle_forecast_note,
    latest_cycle_ref,
    latest_cycle_rows,
    pool_gpu_totals,
    pool_history,
)
from apps.dashboard.presenters import (
    age_s,
    arrivals_chart,
    fleet_view,
    heat_map,
    heat_map_svg,
    history_charts,
    idle_chart,
    one_line,
    quota_bars,
    run_view,
    whatif_runs,
)
from apps.forecasting.selectors import pool_arrivals_beside, pool_idle_beside
from apps.inventory import selectors as inventory
from apps.inventory.models import Node
from apps.logs import selectors as logs
from apps.metrics.selectors import fleet_readings
from apps.scheduling.selectors import cycle_list, quota_usage
from apps.tenants import selectors as tenant_selectors
from apps.tenants import services as tenant_services
from apps.tenants.access import require_platform_admin, require_role
from apps.tenants.models import ApiToken, Membership
from apps.tenants.selectors import Access, access_for, tenant_list
from apps.workloads import selectors as workloads
from apps.workloads import services as workload_services
from apps.workloads.models import Task
from apps.workloads.state_machine import FINAL
from whalegen.placement.registry import POLICY_NAMES

TASKS_PER_PAGE = 50
HEATMAP_NODES_PER_PAGE = 100  # 800 GPU cells at most: a page a browser draws at once
LOG_TAIL_LINES = 200  # the task page's tail; the rest through the API or `whalegen tasks logs`
RECENT_OVERRIDES = 50
TOKENS_PER_PAGE = 50
MEMBER = Membership.Role.MEMBER


def page_access(request: HttpRequest) -> Access:
    """What the signed-in user may see and do, computed once per request (two queries)."""
    cached = getattr(request, "_whalegen_access", None)
    if cached is None:
        cached = access_for(user=request.user)
        request._whalegen_access = cached  # type: ignore[attr-defined]
    return cached


def _refused(request: HttpRequest, error: ApplicationError, back: str) -> HttpResponse:
    return render(
        request, "dashboard/refused.html", {"message": error.message, "back": back}, status=error.status
    )


def _member_queues(access: Access) -> Any:
    """Queues the caller may act on (member role or above): the choices of the override form."""
    queues = workloads.queue_list(access=access)
    if access.platform_admin:
        return queues
    return queues.filter(tenant_id__in=[t for t in access.tenant_ids if access.has(t, MEMBER)])


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    access = page_access(request)
    tenants = list(tenant_list(access=access))
    now = timezone.now()
    usage = quota_usage(tenant_ids=[t.pk for t in tenants])
    bars = defaultdict(list)
    for bar in quota_bars(workloads.quota_list(access=access), usage):
        bars[bar.quota.tenant_id].append(bar)
    queues = defaultdict(list)
    for queue in workloads.queue_list_with_counts(access=access):
        queue.oldest_pending_age_s = age_s(queue.oldest_pending_at, now)
        queues[queue.tenant_id].append(queue)
    sections = [
        {"tenant": t, "role": access.role(t.pk), "bars": bars[t.pk], "queues": queues[t.pk]}
        for t in tenants
        # A platform admin sees every tenant; only those with something to show fill the page.
        if not access.platform_admin or bars[t.pk] or queues[t.pk] or access.role(t.pk)
    ]
    # A platform admin's home page opens with the whole fleet: every pool and cluster in one table.
    fleet = fleet_view(fleet_readings()) if access.platform_admin else None
    context = {"sections": sections, "access": access, "fleet": fleet, "now": now}
    return render(request, "dashboard/overview.html", context)


@login_required
def task_list(request: HttpRequest) -> HttpResponse:
    access = page_access(request)
    queues = workloads.queue_list(access=access)
    form = TaskFilterForm(request.GET or None, queues=queues)
    tasks = workloads.task_list(access=access)
    status = 200
    if form.is_bound:
        if form.is_valid():
            if form.cleaned_data["state"]:
                tasks = tasks.filter(state=form.cleaned_data["state"])
            if form.cleaned_data["queue"] is not None:
                tasks = tasks.filter(queue=form.cleaned_data["queue"])
        else:
            tasks = tasks.none()
            status = 400
    page = Paginator(tasks, TASKS_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    ended = [task.pk for task in page if task.state in (Task.State.FAILED, Task.State.CANCELLED)]
    reasons = logs.task_end_reasons(task_ids=ended)
    for task in page:
        task.end_reason = one_line(reasons.get(task.pk, ""))  # the list says why a task failed
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "access": access,
    }
    return render(request, "dashboard/task_list.html", context, status=status)


def _task_page(
    request: HttpRequest,
    access: Access,
    task_id: int,
    cancel_form: CancelForm | None = None,
    status: int = 200,
) -> HttpResponse:
    task = workloads.task_get(access=access, task_id=task_id)
    # A task without a forecast raises RelatedObjectDoesNotExist, an AttributeError: getattr's default.
    forecast = getattr(task, "forecast", None)
    may_act = access.has(task.tenant_id, MEMBER)
    attempt = _attempt_param(request.GET.get("attempt"))
    output = logs.task_log_page(
        task=task, attempt=attempt, offset=0, limit=LOG_TAIL_LINES, tail=LOG_TAIL_LINES
    )
    ended = task.state in (Task.State.FAILED, Task.State.CANCELLED)
    why = logs.task_end_reasons(task_ids=[task.pk]).get(task.pk, "") if ended else ""
    run = run_view(
        command=task.command, env=task.env, exit_code=task.exit_code, failure_reason=why, page=output
    )
    context = {
        "task": task,
        "run": run,
        "events": workloads.task_events(task=task),
        "forecast": forecast,
        "overrides": approvals.override_list(access=access).filter(task=task),
        "can_cancel": may_act and task.state not in FINAL,
        "can_request": may_act and task.state not in FINAL,
        "cancel_form": cancel_form or CancelForm(),
    }
    return render(request, "dashboard/task_detail.html", context, status=status)


def _attempt_param(value: str | None) -> int | None:
    """`?attempt=N` picks a run; anything else shows the current one."""
    return int(value) if value is not None and value.isdigit() else None


@login_required
def task_detail(request: HttpRequest, task_id: int) -> HttpResponse:
    return _task_page(request, page_access(request), task_id)


@login_required
@require_POST
def task_cancel(request: HttpRequest, task_id: int) -> HttpResponse:
    access = page_access(request)
    task = workloads.task_get(access=access, task_id=task_id)
    back = reverse("dashboard:task-detail", args=[task.pk])
    form = CancelForm(request.POST)
    if not form.is_valid():
        return _task_page(request, access, task.pk, cancel_form=form, status=400)
    try:
        require_role(access, task.tenant, MEMBER, "cancelling tasks")
        workload_services.task_cancel(task=task, by=request.user, reason=form.cleaned_data["reason"])
    except ApplicationError as error:
        return _refused(request, error, back)
    messages.success(request, f"Task {task.pk} cancelled.")
    return redirect(back)


def _overrides_page(
    request: HttpRequest,
    access: Access,
    form: OverrideRequestForm | None = None,
    decision_error: tuple[int, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    queues = _member_queues(access)
    if form is None:
        form = OverrideRequestForm(initial={"task": request.GET.get("task")}, queues=queues)
    overrides = approvals.override_list(access=access).prefetch_related("audit")
    pending = overrides.filter(state=PriorityOverride.State.PENDING)
    decided = overrides.exclude(state=PriorityOverride.State.PENDING)[:RECENT_OVERRIDES]
    context = {
        "form": form,
        "can_request": access.platform_admin or any(access.has(t, MEMBER) for t in access.tenant_ids),
        "pending": pending,
        "decided": decided,
        "access": access,
        "decision_error": decision_error,
    }
    return render(request, "dashboard/overrides.html", context, status=status)


@login_required
def overrides(request: HttpRequest) -> HttpResponse:
    access = page_access(request)
    if request.method != "POST":
        return _overrides_page(request, access)
    form = OverrideRequestForm(request.POST, queues=_member_queues(access))
    if not form.is_valid():
        return _overrides_page(request, access, form=form, status=400)
    values = form.cleaned_data
    task = queue = None
    if values["task"] is not None:
        try:
            task = workloads.task_get(access=access, task_id=values["task"])
        except Http404:
            # Unknown and invisible read the same, as in the API.
            form.add_error("task", f"unknown task {values['task']}")
            return _overrides_page(request, access, form=form, status=400)
    else:
        queue = values["queue"]
    tenant = (task or queue).tenant
    try:
        require_role(access, tenant, MEMBER, "requesting a priority override")
        override = approval_services.override_request(
            tenant=tenant,
            task=task,
            queue=queue,
            wanted_priority=values["wanted_priority"],
            reason=values["reason"],
            requested_by=request.user,
            ttl_hours=values["ttl_hours"],
        )
    except ValidationError as error:
        form.add_service_errors(error)
        return _overrides_page(request, access, form=form, status=400)
    except ApplicationError as error:
        form.add_error(None, error.message)
        return _overrides_page(request, access, form=form, status=error.status)
    messages.success(request, f"Override {override.pk} requested; a platform admin decides it.")
    return redirect("dashboard:overrides")


def _decide(request: HttpRequest, override_id: int, approve: bool) -> HttpResponse:
    access = page_access(request)
    override = approvals.override_get(access=access, override_id=override_id)
    back = reverse("dashboard:overrides")
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _overrides_page(
            request, access, decision_error=(override.pk, "comment is too long"), status=400
        )
    comment = form.cleaned_data["comment"]
    try:
        require_platform_admin(access, "deciding overrides")
        if approve:
            approval_services.override_approve(override=override, by=request.user, comment=comment)
        else:
            approval_services.override_reject(override=override, by=request.user, comment=comment)
    except ValidationError as error:
        message = " ".join(m for msgs in error.message_dict.values() for m in msgs)
        return _overrides_page(request, access, decision_error=(override.pk, message), status=400)
    except ApplicationError as error:
        return _refused(request, error, back)
    verb = "approved" if approve else "rejected"
    messages.success(request, f"Override {override.pk} {verb}.")
    return redirect(back)


@login_required
@require_POST
def override_approve(request: HttpRequest, override_id: int) -> HttpResponse:
    return _decide(request, override_id, approve=True)


@login_required
@require_POST
def override_reject(request: HttpRequest, override_id: int) -> HttpResponse:
    return _decide(request, override_id, approve=False)


@login_required
def pool_list(request: HttpRequest) -> HttpResponse:
    access = page_access(request)
    pools = list(inventory.pool_list(access=access))
    latest = latest_cycle_rows(pool_ids=[pool.pk for pool in pools])
    rows = [{"pool": pool, "cycle": latest.get(pool.pk)} for pool in pools]
    return render(request, "dashboard/pool_list.html", {"rows": rows, "access": access})


@login_required
def accounting(request: HttpRequest) -> HttpResponse:
    """GPU-hours per tenant and pool: this month so far against last month, with budgets."""
    now = timezone.now()
    context = {
        "rows": tenant_months(access=page_access(request), now=now),
        "this_month": month_start(now),
        "last_month": previous_month_start(now),
        "now": now,
    }
    return render(request, "dashboard/accounting.html", context)


@login_required
def pool_detail(request: HttpRequest, pool_id: int) -> HttpResponse:
    access = page_access(request)
    pool = inventory.pool_get(access=access, pool_id=pool_id)
    # A large pool's heat-map comes a page of nodes at a time; the header counts the whole pool.
    node_ids = Node.objects.filter(pool=pool).order_by("cluster__name", "name").values_list("pk", flat=True)
    nodes = Paginator(node_ids, HEATMAP_NODES_PER_PAGE).get_page(request.GET.get("page"))
    gpus = heat_map_gpus(node_ids=list(nodes))
    visible = None if access.platform_admin else set(access.tenant_ids)
    drawn = heat_map(gpus, visible)
    totals = pool_gpu_totals(pool_id=pool.pk)
    cycles = list(cycle_list(pool_id=pool.pk)[:10])
    latest = cycles[0] if cycles else None
    stats = latest.stats if latest is not None else {}
    context = {
        "pool": pool,
        "map": drawn,
        "map_svg": mark_safe(heat_map_svg(drawn, pool.name)),
        "nodes": nodes,
        "totals": totals,
        "latest": latest,
        "unplaced_by_reason": sorted((stats.get("unplaced_by_reason") or {}).items(), key=lambda kv: -kv[1]),
        "frag_before": stats.get("fragmentation_before"),
        "frag_after": stats.get("fragmentation_after"),
        "cycles": cycles,
        "access": access,
    }
    return render(request, "dashboard/pool_detail.html", context)


@login_required
def pool_whatif_page(request: HttpRequest, pool_id: int) -> HttpResponse:
    """What another placement policy would do with this pool now, beside the cycle's own policy.

    The pool's current snapshot goes through the same decision step the cycle runs, inside a
    transaction that is rolled back (`apps.scheduling.whatif`): nothing is placed or written. It is
    decided once per scheduling cycle, off the request (`apps.dashboard.whatif`): until it is ready the
    page says so, shows the last earlier decision, and its live part swaps the answer in. A member
    sees the names of their own tenants' tasks only; other tenants' tasks are counted, not named.
    """
    access = page_access(request)
    pool = inventory.pool_get(access=access, pool_id=pool_id)
    configured = settings.WHALEGEN_CYCLE_POLICY
    wanted = request.GET.get("policy") or next(p for p in POLICY_NAMES if p != configured)
    context: dict[str, Any] = {
        "pool": pool,
        "policies": POLICY_NAMES,
        "wanted": wanted,
        "configured": configured,
        "access": access,
    }
    if wanted not in POLICY_NAMES:
        context["error"] = f"unknown policy {wanted!r}; choose one of {', '.join(POLICY_NAMES)}"
        return render(request, "dashboard/pool_whatif.html", context, status=400)
    policies = (configured,) if wanted == configured else (configured, wanted)
    cycle = latest_cycle_ref(pool_id=pool.pk)
    if cycle is None:  # no cycle to key it on: a new pool, decided on every request
        answer = whatif.Answer(whatif.decide_now(pool_name=pool.name, policies=policies), None, False)
    else:
        answer = whatif.answer(pool_id=pool.pk, policies=policies, cycle=cycle)
    shown = answer.summary or answer.earlier
    context.update(
        {
            "answer": answer,
            "report": shown,
            "report_now": parse_datetime(shown["now"]) if shown else None,
            "report_cycle_at": parse_datetime(shown.get("cycle_started_at") or "") if shown else None,
            "cycle": cycle,
            "runs": whatif_runs(shown, access) if shown else [],
        }
    )
    if answer.computing:
        context["live_refresh_s"] = 2  # the answer is seconds away: look for it sooner than every 5 s
    return render(request, "dashboard/pool_whatif.html", context)


HISTORY_HOURS = (1, 6, 24, 72)


def _has_cycles_before(pool_id: int, when: Any) -> bool:
    from apps.scheduling.models import Cycle

    return Cycle.objects.filter(pool_id=pool_id, started_at__lt=when).exists()


@login_required
def pool_history_page(request: HttpRequest, pool_id: int) -> HttpResponse:
    """The pool over the last hours: allocation and busy %, fragmentation, pending by reason, waits."""
    access = page_access(request)
    pool = inventory.pool_get(access=access, pool_id=pool_id)
    now = timezone.now()
    try:
        # Without a choice: six hours, or one while the pool's history is younger than an hour (a new
        # pool's few minutes would be squeezed into the last bucket of a longer window).
        hours = int(
            request.GET.get("hours") or (6 if _has_cycles_before(pool.pk, now - timedelta(hours=1)) else 1)
        )
    except ValueError:
        hours = 0
    if hours not in HISTORY_HOURS:
        return _refused(
            request,
            ApplicationError(f"hours must be one of {', '.join(map(str, HISTORY_HOURS))}"),
            reverse("dashboard:pool-history", args=[pool.pk]),
        )
    history = pool_history(pool=pool, now=now, hours=hours)
    arrivals = pool_arrivals_beside(pool_id=pool.pk, now=now)
    idle = pool_idle_beside(pool=pool, now=now)
    idle_note = idle_forecast_note(pool_id=pool.pk, now=now) if idle.model_version is None else ""
    context = {
        "pool": pool,
        "history": history,
        "charts": [*history_charts(history), arrivals_chart(arrivals), idle_chart(idle, idle_note)],
        "hours": hours,
        "choices": HISTORY_HOURS,
        "access": access,
    }
    return render(request, "dashboard/pool_history.html", context)


# ------------------------------------------------------------------------------------------ API tokens


def _tokens_page(
    request: HttpRequest,
    access: Access,
    form: TokenCreateForm | None = None,
    created: tuple[ApiToken, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    """Make a token (its secret shown on this one answer), and the tokens the caller may see: their own,
    their administered tenants' (tenant admins), all (platform admins): the API's rule."""
    tenants = tenant_list(access=access)
    tokens = tenant_selectors.token_list(access=access, user=request.user)
    page = Paginator(tokens, TOKENS_PER_PAGE).get_page(request.GET.get("page"))
    now = timezone.now()
    for token in page:
        token.state = tenant_selectors.token_state(token, now=now)
    context = {
        "form": form or TokenCreateForm(tenants=tenants),
        "can_create": access.platform_admin or bool(access.roles),
        "page": page,
        "access": access,
        "created": created,
        "sees_others": access.platform_admin
        or any(access.has(t, Membership.Role.ADMIN) for t in access.tenant_ids),
    }
    response = render(request, "dashboard/tokens.html", context, status=status)
    if created is not None:
        # The secret is in this page only: neither a cache nor the back button may keep a copy.
        response["Cache-Control"] = "no-store"
    return response


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    access = page_access(request)
    if request.method != "POST":
        return _tokens_page(request, access)
    form = TokenCreateForm(request.POST, tenants=tenant_list(access=access))
    if not form.is_valid():
        return _tokens_page(request, access, form=form, status=400)
    values = form.cleaned_data
    try:
        created = tenant_services.token_create(
            user=request.user,
            tenant=values["tenant"],
            name=values["name"],
            role=values["role"] or None,
            ttl_days=values["ttl_days"],
            access=access,
            by=request.user,
            via=tenant_services.Via.DASHBOARD,
        )
    except ValidationError as error:
        form.add_service_errors(error)
        return _tokens_page(request, access, form=form, status=400)
    except ApplicationError as error:
        form.add_error("role", error.message)
        return _tokens_page(request, access, form=form, status=error.status)
    # Rendered, not redirected: the secret must not travel through the session to the next page.
    return _tokens_page(request, access, created=created)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    access = page_access(request)
    token = tenant_selectors.token_get(access=access, user=request.user, token_id=token_id)
    tenant_services.token_revoke(token=token, by=request.user, via=tenant_services.Via.DASHBOARD)
    messages.success(request, f"Token {token.prefix}… ({token.name}) revoked.")
    return redirect("dashboard:tokens")
