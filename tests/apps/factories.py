"""factory-boy factories for the control plane's models. Tasks made here bypass submission and its rules:
use them to fill lists; use `task_submit` when admission matters."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.approvals.models import PriorityOverride
from apps.fleet.models import GpuSample, TaskSample
from apps.inventory.models import Cluster, ComputeUnit, Node, Pool
from apps.tenants.models import Membership, Tenant
from apps.workloads.models import Queue, Quota, Task, TaskWait

if TYPE_CHECKING:
    from apps.scheduling.models import Assignment


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = "!"  # unusable: hashing a real one costs ~0.3 s per user, for nothing here


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    slug = factory.Sequence(lambda n: f"team{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())
    kind = Tenant.Kind.TEAM


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Membership.Role.MEMBER


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster{n}")
    region = "eu-west"


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Pool

    name = factory.Sequence(lambda n: f"pool{n}")
    # The model's default is `container` (a new pool runs images); the factory's pools run host processes
    # so that the many tests submitting a bare `command` keep testing what they test. Container pools are
    # asked for by name: PoolFactory(runtime=Pool.Runtime.CONTAINER).
    runtime = Pool.Runtime.PROCESS


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    pool = factory.SubFactory(PoolFactory)
    name = factory.Sequence(lambda n: f"node{n}")
    cpu_milli = 64_000
    mem_mib = 512 * 1024


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    tenant = factory.SubFactory(TenantFactory)
    pool = factory.SubFactory(PoolFactory)
    guaranteed_milli = 4000
    borrow_limit_milli = 0


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Queue

    tenant = factory.SubFactory(TenantFactory)
    pool = factory.SubFactory(PoolFactory)
    name = factory.Sequence(lambda n: f"queue{n}")


# The scheduler's words on a pending task live in its TaskWait row: `TaskFactory(why_pending=…,
# why_pending_code=…, predicted_start_at=…)` writes one.
TASK_WAIT_FIELDS = {"why_pending": "why", "why_pending_code": "code", "predicted_start_at": "start_at"}


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    queue = factory.SubFactory(QueueFactory)
    tenant = factory.SelfAttribute("queue.tenant")
    pool = factory.SelfAttribute("queue.pool")
    name = factory.Sequence(lambda n: f"task{n}")
    priority = 0
    command = ["python", "train.py"]

    @classmethod
    def _create(cls, model_class: type[Task], *args: Any, **kwargs: Any) -> Task:
        wait = {field: kwargs.pop(name) for name, field in TASK_WAIT_FIELDS.items() if name in kwargs}
        task = super()._create(model_class, *args, **kwargs)
        if wait:
            TaskWait.objects.create(task=task, **wait)
        return task


class OverrideFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PriorityOverride

    task = factory.SubFactory(TaskFactory)
    tenant = factory.SelfAttribute("task.tenant")
    wanted_priority = 10
    reason = "deadline"
    requested_by = factory.SubFactory(UserFactory)
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=24))


class GpuSampleFactory(factory.django.DjangoModelFactory):
    """One GPU telemetry sample; pass `gpu` and `at` (the agent's heartbeat instant)."""

    class Meta:
        model = GpuSample

    at = factory.LazyFunction(timezone.now)
    mem_total_mib = 81_559


class TaskSampleFactory(factory.django.DjangoModelFactory):
    """One task process's GPU memory at an instant; pass `task`, `gpu`, `at` and `used_mib`."""

    class Meta:
        model = TaskSample

    at = factory.LazyFunction(timezone.now)
    pid = factory.Sequence(lambda n: 1_000 + n)


def units_held_by(task: Task) -> list[ComputeUnit]:
    """The units `task` holds: those its live assignment lists (a unit stores no holder)."""
    from apps.scheduling.selectors import held_unit_ids

    return list(ComputeUnit.objects.filter(pk__in=held_unit_ids(task_ids=[task.pk]).get(task.pk, [])))


def holder_of(unit: ComputeUnit) -> int | None:
    """The task holding `unit`, if any."""
    from apps.scheduling.holders import unit_holders

    return unit_holders(node_ids=[unit.gpu.node_id]).get(unit.pk)


def hold(task: Task, units: list[ComputeUnit]) -> Assignment:
    """Make `task` hold `units`, as a cycle's commit would: a live assignment on their node listing them."""
    from apps.scheduling.models import Assignment

    (node_id,) = {unit.gpu.node_id for unit in units}
    return Assignment.objects.create(task=task, node_id=node_id, unit_ids=[unit.pk for unit in units])


def held_milli(quota: Quota) -> int:
    """What the quota's tenant holds in its pool now: its admitted, assigned and running tasks' asks (what
    admission counts against the limit; pending tasks hold nothing)."""
    from apps.scheduling.selectors import live_usage

    return live_usage(pool_id=quota.pool_id, tenant_ids=[quota.tenant_id])[0][quota.tenant_id]
