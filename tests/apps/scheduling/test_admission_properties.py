"""Properties of admission over random pools, quotas and request sequences, on the real services and
cycles: a request is refused exactly when it could never run (asks more than the tenant's limit, or more
GPUs than any node has); what admitted tasks hold never passes the limit; a pending task holds nothing;
and a cycle leaves no task waiting on quota while its tenant has room for it."""

from __future__ import annotations

from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.scheduling.services import cycle_run
from apps.workloads.models import Task
from apps.workloads.services import CannotRunHere, TaskSubmission, task_submit, task_transition
from tests.apps.factories import held_milli
from tests.apps.scheduling.conftest import NOW, Fleet

_pools = count()

steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 10)),  # whole GPUs asked
        st.tuples(st.just("cycle"), st.just(0)),
        st.tuples(st.just("end"), st.integers(0, 20)),  # ends the n-th admitted task, if there is one
    ),
    min_size=3,
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    node_gpus=st.lists(st.integers(1, 8), min_size=1, max_size=3),
    guaranteed=st.integers(1, 8),
    borrow=st.integers(0, 4),
    script=steps,
)
def test_refused_exactly_when_never_runnable_and_admitted_never_above_the_limit(
    fleet: Fleet, node_gpus: list[int], guaranteed: int, borrow: int, script: list[tuple[str, int]]
) -> None:
    from apps.inventory.services import pool_create

    fleet.pool = pool_create(name=f"p{next(_pools)}", runtime="process")  # a fresh pool per example
    for gpus in node_gpus:
        fleet.node(gpus=gpus)
    slug = f"t{fleet.pool.pk}"
    tenant = fleet.tenant(slug, guaranteed=1000 * guaranteed, borrow=1000 * borrow)
    quota = tenant.quotas.get()
    limit_gpus = guaranteed + borrow
    for action, amount in script:
        if action == "submit":
            never = amount > limit_gpus or amount > max(node_gpus)
            try:
                task_submit(
                    tenant=tenant, request=TaskSubmission(queue="q", gpu_count=amount), submitted_by=None
                )
                refused = False
            except CannotRunHere:
                refused = True
            assert refused == never, (amount, limit_gpus, node_gpus)
        elif action == "cycle":
            cycle_run(pool_id=fleet.pool.pk, now=NOW)
        else:
            admitted = list(Task.objects.filter(pool=fleet.pool, state="assigned").order_by("pk"))
            if admitted:
                task_transition(
                    task=admitted[amount % len(admitted)], to_state="cancelled", actor="test", reason="done"
                )
        held = held_milli(quota)
        assert held <= quota.limit_milli
        live = Task.objects.filter(pool=fleet.pool, state__in=["admitted", "assigned", "running"])
        assert held == sum(t.charge_milli for t in live)  # pending tasks are not in it
        if action == "cycle":
            # Every task left waiting for quota would pass the limit now: no room was left unused.
            for task in Task.objects.filter(pool=fleet.pool, state="pending").select_related("wait"):
                if task.why_pending_code == "quota_exceeded":
                    assert held + task.charge_milli > quota.limit_milli
