"""Writes for queues, quotas and tasks: submission (refusing only what could never run), and every state
change."""

from __future__ import annotations

import contextlib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, F, OuterRef, QuerySet, Subquery, Sum
from django.utils import timezone

from apps.common import hooks
from apps.common.errors import BulkItemError, CodedValidationError, Conflict
from apps.common.words import plural
from apps.inventory.models import Gpu, Node, Pool
from apps.tenants.models import Tenant, run_uid_refusal
from apps.workloads.models import Queue, Quota, Task, TaskEvent, TaskWait
from apps.workloads.selectors import quota_live_tasks
from apps.workloads.state_machine import FINAL, RETRY_FROM, check_transition
from apps.workloads.task_insert import queue_get_for_submission, tasks_insert
from whalegen.gpus import UnknownGpuModel, get_model
from whalegen.placement.words import gpus_text


def user_actor(user: AbstractBaseUser | None) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


# ---------------------------------------------------------------------------------------------- queues


def queue_create(
    *,
    tenant: Tenant,
    pool: Pool,
    name: str,
    default_priority: int = 0,
    weight: int = 1,
    idle_reclaim: str = Queue.IdleReclaim.NOTIFY,
    default_image: str = "",
) -> Queue:
    if Queue.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": [f"tenant {tenant.slug!r} already has a queue named {name!r}"]})
    queue = Queue(
        tenant=tenant,
        pool=pool,
        name=name,
        default_priority=default_priority,
        weight=weight,
        idle_reclaim=idle_reclaim,
        default_image=default_image,
    )
    _check_default_image(queue)
    queue.full_clean()
    queue.save()
    return queue


def _check_default_image(queue: Queue) -> None:
    """A queue's default image must be a reference its pool would take from a task (format, prefixes);
    a process pool's queue may keep one (it is ignored there), so a pool's runtime can change back."""
    image = queue.default_image
    if not image:
        return
    if refusal := image_reference_refusal(image):
        raise ValidationError({"default_image": [refusal]})
    if refusal := _image_prefix_refusal(image, queue.pool):
        raise ValidationError({"default_image": [refusal]})


def queue_update(*, queue: Queue, data: dict[str, Any]) -> Queue:
    """Change a queue's name, default priority, weight, idle-reclaim policy or default image. Its pool is
    fixed: tasks already point at it. A new default image applies to tasks submitted afterwards."""
    if (
        "name" in data
        and Queue.objects.filter(tenant=queue.tenant_id, name=data["name"]).exclude(pk=queue.pk).exists()
    ):
        raise ValidationError({"name": [f"this tenant already has a queue named {data['name']!r}"]})
    for key in ("name", "default_priority", "weight", "idle_reclaim", "default_image"):
        if key in data:
            setattr(queue, key, data[key])
    _check_default_image(queue)
    queue.full_clean()
    queue.save()
    return queue


def queue_delete(*, queue: Queue) -> None:
    if queue.tasks.exclude(state__in=FINAL).exists():
        raise Conflict(f"queue {queue.name!r} still has unfinished tasks; cancel or wait for them first")
    # Finished tasks keep their history; a queue that has ever held tasks is PROTECTed by them.
    if queue.tasks.exists():
        raise Conflict(f"queue {queue.name!r} has task history and cannot be deleted")
    queue.delete()


# ---------------------------------------------------------------------------------------------- quotas


def quota_set(
    *,
    tenant: Tenant,
    pool: Pool,
    guaranteed_milli: int,
    borrow_limit_milli: int = 0,
    gpu_mem_limit_mib: int | None = None,
) -> Quota:
    """Create or change a tenant's quota in a pool. Lowering it below what the tenant holds is allowed:
    admitted work is never evicted by a quota edit; nothing new is admitted until what it holds falls."""
    quota, _ = Quota.objects.update_or_create(
        tenant=tenant,
        pool=pool,
        defaults={
            "guaranteed_milli": guaranteed_milli,
            "borrow_limit_milli": borrow_limit_milli,
            "gpu_mem_limit_mib": gpu_mem_limit_mib,
        },
    )
    return quota


def quota_delete_refusal(quota: Quota) -> str:
    """Why `quota` may not be deleted for what it holds ("" when it may): the tenant's live tasks in the
    pool. A budget on it is accounting's to refuse (apps.accounting.services.quota_budget_refusal)."""
    live = quota_live_tasks(quota)
    if live:
        return (
            f"tenant {quota.tenant.slug!r} has {plural(live, 'live task')} in pool {quota.pool.name!r}; "
            "they must finish or be cancelled first"
        )
    return ""


def quota_delete(*, quota: Quota) -> None:
    """Delete a quota whose refusals were asked first, inside the same transaction."""
    quota.delete()


# ----------------------------------------------------------------------------------------------- pools


def pool_delete_refusal(pool: Pool) -> str:
    """Why `pool` may not be deleted ("" when it may): here, not in apps.inventory, because its tasks,
    queues and quotas are this app's rows."""
    live = Task.objects.filter(pool=pool).exclude(state__in=FINAL).count()
    if live:
        return f"pool {pool.name!r} has {plural(live, 'live task')}; they must finish or be cancelled"
    for related, what in ((pool.nodes, "node"), (pool.queues, "queue"), (pool.quotas, "quota")):
        count = related.count()
        if count:
            return f"pool {pool.name!r} still has {plural(count, what)}; remove or move them first"
    if Task.objects.filter(pool=pool).exists():
        return f"pool {pool.name!r} has task history, which keeps it"
    return ""


# ----------------------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class TaskSubmission:
    """What a submitter asks for (ARCHITECTURE §2), in the API's words. Units: milli-GPUs per GPU, MiB,
    CPU milli-cores. Not the core's `whalegen.placement.types.TaskRequest`: the snapshot reader builds
    that one from the stored task."""

    queue: str
    name: str = ""
    gpu_count: int = 1
    gpu_milli: int = 1000
    gpu_mem_mib: int | None = None
    cpu_milli: int = 1000
    host_mem_mib: int = 4096
    allowed_gpu_models: list[str] = field(default_factory=list)
    isolation: str = Task.Isolation.ANY
    kind: str = Task.Kind.BATCH
    sla_class: str = Task.SlaClass.BATCH
    priority: int | None = None
    preemptible: bool = True
    gang_id: str = ""
    gang_size: int = 1
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    max_runtime_s: int | None = None
    working_dir: str = ""
    profile_key: str = ""
    image: str = ""  # blank: the queue's default image (container pools)


_REQUEST_FIELDS = tuple(f.name for f in fields(TaskSubmission) if f.name != "queue")


class CannotRunHere(CodedValidationError):
    """A valid request the pool could never run, whatever ends or frees: above the tenant's limit, larger
    than any node, no quota. The API answers it 400 with `code: cannot_run_here`, so a pipeline can tell
    "this file can never run there" (exit 66) from "fix a typo" (65); a busy pool or a full quota is not
    one of these: such a request is accepted and waits (docs/scheduling.md, "Admission")."""

    api_code = "cannot_run_here"


def _validate_shape(request: TaskSubmission) -> list[str]:
    """Check the rules that need no database; return canonical model names. Raises ValidationError."""
    errors: dict[str, list[str]] = {}
    canonical: list[str] = []
    for name in request.allowed_gpu_models:
        try:
            canonical.append(get_model(name).name)
        except UnknownGpuModel as exc:
            errors.setdefault("allowed_gpu_models", []).append(str(exc))
    if request.gpu_milli < 1000 and request.gpu_count > 1:
        errors.setdefault("gpu_milli", []).append(
            f"a share below a whole GPU ({request.gpu_milli} milli) is for one GPU; "
            f"gpu_count is {request.gpu_count}. Ask for whole GPUs (1000) or gpu_count 1."
        )
    if request.isolation == Task.Isolation.EXCLUSIVE and request.gpu_milli < 1000:
        errors.setdefault("isolation", []).append(
            "exclusive isolation takes whole GPUs; set gpu_milli to 1000"
        )
    if request.isolation in {Task.Isolation.MIG, Task.Isolation.MPS} and request.gpu_count > 1:
        errors.setdefault("isolation", []).append(
            f"{request.isolation} isolation gives one slice of one GPU; gpu_count must be 1"
        )
    if request.gang_size > 1 and not request.gang_id:
        errors.setdefault("gang_id", []).append("a gang of more than one task needs a gang_id")
    if errors:
        raise ValidationError(errors)
    return canonical


# An OCI image reference as the distribution spec writes it (github.com/distribution/reference):
# [registry[:port]/]name[/name…][:tag][@algorithm:hex]. Checked here so a typo is a 400 at submission,
# not a pull failure on a GPU host minutes later.
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE_REFERENCE = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?")
IMAGE_MAX_LENGTH = 512


def image_reference_refusal(image: str) -> str:
    """Why `image` is not a plausible OCI image reference ("" when it is)."""
    if len(image) > IMAGE_MAX_LENGTH:
        return f"an image reference is at most {IMAGE_MAX_LENGTH} characters"
    if not _IMAGE_REFERENCE.fullmatch(image):
        return (
            f"{image!r} is not an OCI image reference: [registry/]name[:tag][@digest], the name in "
            "lowercase, no spaces (e.g. registry.example.org/ml/trainer:1.4)"
        )
    return ""


def _runtime_and_image(*, tenant: Tenant, queue: Queue, request: TaskSubmission) -> tuple[str, str]:
    """The runtime the task gets (its pool's) and the image it runs (its own, else its queue's default;
    blank for a process run), or a ValidationError on `image` saying what to do."""
    pool = queue.pool
    if uid_refusal := run_uid_refusal(tenant.run_uid_effective):
        raise ValidationError(
            {"queue": [f"tenant {tenant.slug!r} has no usable run uid ({uid_refusal}); ask a platform admin"]}
        )
    if pool.runtime == Pool.Runtime.PROCESS:
        if request.image:
            raise ValidationError(
                {"image": [f"pool {pool.name!r} runs host processes, not images; leave image out"]}
            )
        return pool.runtime, ""
    image = request.image or queue.default_image
    if not image:
        raise ValidationError(
            {
                "image": [
                    f"pool {pool.name!r} runs containers: name an image (image: …) or ask a tenant admin "
                    f"to set queue {queue.name!r}'s default image"
                ]
            }
        )
    if refusal := image_reference_refusal(image):
        raise ValidationError({"image": [refusal]})
    if refusal := _image_prefix_refusal(image, pool):
        raise ValidationError({"image": [refusal]})
    return pool.runtime, image


def _image_prefix_refusal(image: str, pool: Pool) -> str:
    """Why the pool's operator does not allow `image` ("" when it does, or when the pool allows any)."""
    prefixes = pool.allowed_image_prefixes or []
    if not prefixes or any(image.startswith(prefix) for prefix in prefixes):
        return ""
    allowed = " or ".join(repr(prefix) for prefix in prefixes)
    return f"image {image!r} is not allowed in pool {pool.name!r}: it must start with {allowed}"


def _pool_models(pool: Pool) -> dict[str, bool]:
    """One query: which GPU models the pool has, and whether any GPU of each is MIG capable."""
    present: dict[str, bool] = {}
    for model, mig_capable in (
        Gpu.objects.filter(node__pool=pool).values_list("model", "mig_capable").distinct()
    ):
        present[model] = present.get(model, False) or mig_capable
    return present


def _validate_against_pool(
    *, pool: Pool, request: TaskSubmission, models: list[str], known: dict[int, dict[str, bool]] | None = None
) -> None:
    """Check the request against what the pool holds. `known` caches `_pool_models` by pool id (a bulk
    submission reads each pool once)."""
    # Only a request that names models or asks for MIG depends on what the pool holds; the rest (most
    # submissions) skip the query.
    if not models and request.isolation != Task.Isolation.MIG:
        return
    if known is None:
        present = _pool_models(pool)
    elif pool.pk in known:
        present = known[pool.pk]
    else:
        present = known[pool.pk] = _pool_models(pool)
    candidates = {m: cap for m, cap in present.items() if not models or m in models}
    if models and present and not candidates:
        raise CannotRunHere(
            {
                "allowed_gpu_models": [
                    f"pool {pool.name!r} has none of {', '.join(models)} "
                    f"(it has {', '.join(sorted(present))})"
                ]
            }
        )
    if request.isolation == Task.Isolation.MIG and not any(candidates.values()):
        raise CannotRunHere(
            {
                "isolation": [
                    f"pool {pool.name!r} has no MIG-capable GPU"
                    + (" of the allowed models" if models else "")
                ]
            }
        )


@dataclass(frozen=True)
class NodeSize:
    """One node of a pool as admission sees it: what it has when nothing runs on it."""

    cpu_milli: int
    mem_mib: int
    gpus_by_model: Mapping[str, int]

    def gpus(self, models: Sequence[str]) -> int:
        """GPUs of the allowed models (any model when none is named)."""
        if not models:
            return sum(self.gpus_by_model.values())
        return sum(self.gpus_by_model.get(model, 0) for model in models)


def pool_node_sizes(pool_id: int) -> list[NodeSize]:
    """Every node of the pool (cordoned, draining and lost ones too: they may come back), one query."""
    nodes: dict[int, tuple[int, int, dict[str, int]]] = {}
    rows = (
        Node.objects.filter(pool_id=pool_id)
        .values_list("pk", "cpu_milli", "mem_mib", "gpus__model")
        .annotate(count=Count("gpus"))
        .order_by()
    )
    for node_id, cpu_milli, mem_mib, model, count in rows:
        _, _, by_model = nodes.setdefault(node_id, (cpu_milli, mem_mib, {}))
        if model is not None:
            by_model[model] = count
    return [NodeSize(cpu, mem, by_model) for cpu, mem, by_model in nodes.values()]


def _fits(node: NodeSize, task: Task) -> bool:
    return (
        node.cpu_milli >= task.cpu_milli
        and node.mem_mib >= task.host_mem_mib
        and node.gpus(task.allowed_gpu_models) >= task.gpu_count
    )


def _no_quota(tenant: Tenant, pool: Pool) -> CannotRunHere:
    return CannotRunHere(
        {"queue": [f"tenant {tenant.slug!r} has no quota in pool {pool.name!r}; a platform admin sets one"]}
    )


def _above_limit(*, quota: Quota, tenant: Tenant, pool: Pool, asked_milli: int, what: str) -> CannotRunHere:
    limit = quota.limit_milli
    return CannotRunHere(
        {
            "gpu_count": [
                f"{what} asks {gpus_text(asked_milli)}; tenant {tenant.slug!r} may hold at most "
                f"{gpus_text(limit)} in pool {pool.name!r} ({gpus_text(quota.guaranteed_milli)} guaranteed + "
                f"{gpus_text(quota.borrow_limit_milli)} borrowable), so it could never be admitted even with "
                f"all the tenant's work ended; ask for at most {gpus_text(limit)}, or ask a platform admin "
                "for a larger quota"
            ]
        }
    )


def _memory_refusal(*, quota: Quota, task: Task, mem_stated: bool, pool: Pool) -> ValidationError | None:
    if quota.gpu_mem_limit_mib is None:
        return None
    if not mem_stated:
        return ValidationError(
            {"gpu_mem_mib": [f"pool {pool.name!r} bounds this tenant's GPU memory; state gpu_mem_mib"]}
        )
    if task.charge_mem_mib > quota.gpu_mem_limit_mib:
        return CannotRunHere(
            {
                "gpu_mem_mib": [
                    f"the task asks {task.charge_mem_mib} MiB of GPU memory in all; the tenant's quota in "
                    f"pool {pool.name!r} bounds it to {quota.gpu_mem_limit_mib} MiB, so it could never be "
                    "admitted"
                ]
            }
        )
    return None


def _gang_hint(task: Task, largest_gpus: int) -> str:
    """How the same work could be split so each part fits the largest node ("" when no split helps):
    equal members where a split into at most twice the fewest members gives them (ranks usually are
    equal), else the fewest members of at most `largest_gpus` each."""
    if task.gang_id or largest_gpus < 1 or task.gpu_count <= largest_gpus:
        return ""
    fewest = -(-task.gpu_count // largest_gpus)  # ceil
    equal = next((k for k in range(fewest, 2 * fewest + 1) if task.gpu_count % k == 0), None)
    if equal is not None:
        members, each = equal, f"{gpus_text(1000 * (task.gpu_count // equal))} each"
    else:
        members, each = fewest, f"up to {largest_gpus} GPUs each, {task.gpu_count} in all"
    return f"; a gang of {members} tasks with {each} would fit (gang_id, gang_size: {members})"


def _too_large(*, task: Task, pool: Pool, sizes: Sequence[NodeSize]) -> CannotRunHere:
    """Why no node of the pool can ever take the task, naming each amount above the largest node's."""
    models = task.allowed_gpu_models
    of_models = f" of {'/'.join(models)}" if models else ""
    largest_gpus = max(node.gpus(models) for node in sizes)
    largest_cpu = max(node.cpu_milli for node in sizes)
    largest_mem = max(node.mem_mib for node in sizes)
    parts = []
    if task.gpu_count > largest_gpus:
        parts.append(f"{task.gpu_count} GPUs{of_models} (the largest node has {largest_gpus})")
    if task.cpu_milli > largest_cpu:
        parts.append(f"{task.cpu_milli / 1000:g} CPU cores (the largest node has {largest_cpu / 1000:g})")
    if task.host_mem_mib > largest_mem:
        parts.append(f"{task.host_mem_mib} MiB host memory (the largest node has {largest_mem})")
    if not parts:  # each amount fits some node, never all on one
        parts.append(
            f"{task.gpu_count} GPUs{of_models}, {task.cpu_milli / 1000:g} CPU cores and "
            f"{task.host_mem_mib} MiB host memory on one node (each fits some node, none has all)"
        )
    field_name = "gpu_count" if task.gpu_count > largest_gpus else "cpu_milli"
    if task.host_mem_mib > largest_mem and task.gpu_count <= largest_gpus and task.cpu_milli <= largest_cpu:
        field_name = "host_mem_mib"
    return CannotRunHere(
        {
            field_name: [
                f"no node of pool {pool.name!r} ({len(sizes)} nodes) could ever take this task: it asks "
                + "; ".join(parts)
                + _gang_hint(task, largest_gpus)
            ]
        }
    )


def _admission_refusal(
    *,
    quota: Quota | None,
    tenant: Tenant,
    pool: Pool,
    task: Task,
    mem_stated: bool,
    sizes: Sequence[NodeSize] | None,
    gang_asked_milli: int = 0,
) -> ValidationError | None:
    """Why the task could never be admitted in the pool (None: it can, now or once work ends).

    `sizes`: the pool's nodes; None when the caller knows some node fits. A pool with no node yet takes
    the request (nodes may join). `gang_asked_milli`: what the task's gang asks in all, when known."""
    if quota is None:
        return _no_quota(tenant, pool)
    if task.charge_milli > quota.limit_milli:
        return _above_limit(
            quota=quota, tenant=tenant, pool=pool, asked_milli=task.charge_milli, what="the task"
        )
    if gang_asked_milli > quota.limit_milli:
        return _above_limit(
            quota=quota, tenant=tenant, pool=pool, asked_milli=gang_asked_milli, what=f"gang {task.gang_id!r}"
        )
    if refusal := _memory_refusal(quota=quota, task=task, mem_stated=mem_stated, pool=pool):
        return refusal
    if sizes and not any(_fits(node, task) for node in sizes):
        return _too_large(task=task, pool=pool, sizes=sizes)
    return None


def _quota_and_fit_sql(model_count: int) -> str:
    """The read of `_quota_and_fit`, for requests naming `model_count` GPU models (0: any model)."""
    models = f" AND g.model IN ({', '.join(['%s'] * model_count)})" if model_count else ""
    return (
        "SELECT q.id, q.guaranteed_milli, q.borrow_limit_milli, q.gpu_mem_limit_mib, "
        f"EXISTS (SELECT 1 FROM {Node._meta.db_table} n WHERE n.pool_id = q.pool_id), "
        f"EXISTS (SELECT 1 FROM {Node._meta.db_table} n WHERE n.pool_id = q.pool_id "
        "AND n.cpu_milli >= %s AND n.mem_mib >= %s "
        f"AND (SELECT count(*) FROM {Gpu._meta.db_table} g WHERE g.node_id = n.id{models}) >= %s) "
        f"FROM {Quota._meta.db_table} q WHERE q.tenant_id = %s AND q.pool_id = %s"
    )


# Written once per model count rather than compiled by the ORM per submission: the ORM's build of this
# read (three nested subqueries) was 1.9 ms of a 4.7 ms submission (benchmarks/api_inprocess.py).
_QUOTA_AND_FIT_SQL = {count: _quota_and_fit_sql(count) for count in range(4)}


def _quota_and_fit(*, tenant: Tenant, task: Task) -> tuple[Quota | None, bool]:
    """The tenant's quota in the task's pool, and whether some node of the pool could take the task (or
    the pool has no node yet), in one query: a submission's read of everything admission needs. Every
    node counts, whatever its state: a cordoned or lost node may come back."""
    models = list(task.allowed_gpu_models)
    sql = _QUOTA_AND_FIT_SQL.get(len(models)) or _quota_and_fit_sql(len(models))
    with connection.cursor() as cursor:
        cursor.execute(
            sql, [task.cpu_milli, task.host_mem_mib, *models, task.gpu_count, tenant.pk, task.pool_id]
        )
        row = cursor.fetchone()
    if row is None:
        return None, True
    quota_id, guaranteed, borrow, mem_limit, has_nodes, some_fits = row
    quota = Quota(
        pk=quota_id,
        tenant=tenant,
        pool_id=task.pool_id,
        guaranteed_milli=guaranteed,
        borrow_limit_milli=borrow,
        gpu_mem_limit_mib=mem_limit,
    )
    return quota, bool(some_fits) or not has_nodes


def _gang_asked_milli(*, tenant: Tenant, task: Task) -> int:
    """What the task's gang asks in all: its members already stored (not ended) and this one."""
    if not task.gang_id:
        return 0
    stored = (
        Task.objects.filter(tenant=tenant, pool_id=task.pool_id, gang_id=task.gang_id)
        .exclude(state__in=FINAL)
        .aggregate(milli=Sum(F("gpu_count") * F("gpu_milli")))["milli"]
    )
    return (stored or 0) + task.charge_milli


def _request_differences(task: Task, request: TaskSubmission) -> list[str]:
    """Fields where `request` asks for something other than what `task` was submitted with.

    Values the plane filled in (a priority left to the queue's default) and model names written another
    way ("h100" for "H100-80GB") are not differences.
    """
    differing = []
    if task.queue.name != request.queue:
        differing.append("queue")
    for name, asked in asdict(request).items():
        # A priority or image left out was filled in from the queue at submission.
        if name == "queue" or (name == "priority" and asked is None) or (name == "image" and asked == ""):
            continue
        stored = getattr(task, name)
        if name == "allowed_gpu_models":
            with contextlib.suppress(UnknownGpuModel):  # an unknown name is simply a difference
                asked = [get_model(model).name for model in asked]
        if stored != asked:
            differing.append(name)
    return differing


def _same_request_or_conflict(task: Task, request: TaskSubmission, idempotency_key: str) -> Task:
    differing = _request_differences(task, request)
    if differing:
        raise Conflict(
            f"Idempotency-Key {idempotency_key!r} was used for task {task.pk} with a different request "
            f"({', '.join(differing)} differ); use a new key for a new task"
        )
    return task


def _new_task(
    *,
    tenant: Tenant,
    queue: Queue,
    request: TaskSubmission,
    models: list[str],
    submitted_by: AbstractBaseUser | None,
    key: str | None,
) -> Task:
    """The unsaved task a valid request becomes (priority left to the queue filled in)."""
    # Shallow (asdict deep-copies, a tenth of a bulk submission's CPU): the request's lists and dicts
    # were built for this request by the serializer and are not shared.
    values = {name: getattr(request, name) for name in _REQUEST_FIELDS}
    values["allowed_gpu_models"] = models
    if values["priority"] is None:
        values["priority"] = queue.default_priority
    values["runtime"], values["image"] = _runtime_and_image(tenant=tenant, queue=queue, request=request)
    return Task(
        tenant=tenant,
        queue=queue,
        pool=queue.pool,
        submitted_by=submitted_by,
        idempotency_key=key or "",
        **values,
    )


def _submit_one(
    *,
    tenant: Tenant,
    request: TaskSubmission,
    submitted_by: AbstractBaseUser | None,
    idempotency_key: str | None,
) -> tuple[Task, bool]:
    # 1. A retry with a key we have seen returns the task it created; the same key with another request
    #    is a client bug (two jobs sharing a key), refused rather than silently answered with the first.
    if idempotency_key:
        existing = Task.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _same_request_or_conflict(existing, request, idempotency_key), False
    # 2. Rules on the request alone, then against the queue's pool.
    models = _validate_shape(request)
    queue = queue_get_for_submission(tenant_id=tenant.pk, name=request.queue)
    if queue is None:
        raise ValidationError({"queue": [f"tenant {tenant.slug!r} has no queue named {request.queue!r}"]})
    _validate_against_pool(pool=queue.pool, request=request, models=models)
    task = _new_task(
        tenant=tenant,
        queue=queue,
        request=request,
        models=models,
        submitted_by=submitted_by,
        key=idempotency_key,
    )
    # 3. Refuse only what could never be admitted; a full quota or a busy pool is a wait, not a "no".
    #    Nothing is charged: admission (the cycle) charges the task when it places it.
    quota, some_node_fits = _quota_and_fit(tenant=tenant, task=task)
    refusal = _admission_refusal(
        quota=quota,
        tenant=tenant,
        pool=queue.pool,
        task=task,
        mem_stated=request.gpu_mem_mib is not None,
        sizes=None if some_node_fits else pool_node_sizes(queue.pool_id),
        gang_asked_milli=_gang_asked_milli(tenant=tenant, task=task),
    )
    if refusal is not None:
        raise refusal
    tasks_insert([task], actor=user_actor(submitted_by), reason="submitted")
    _no_forecast_yet(task)
    return task, True


def task_waits_write(waits: list[TaskWait]) -> None:
    """Each task's TaskWait row as given, written over the one it had (one upsert per 500 rows)."""
    TaskWait.objects.bulk_create(
        waits,
        update_conflicts=True,
        unique_fields=["task"],
        update_fields=["why", "code", "start_at"],
        batch_size=500,
    )


def _no_forecast_yet(task: Task) -> None:
    """A task just stored has no forecast (it is attached after commit) and no TaskWait row (no cycle has
    seen it): say so to the ORM, so showing the new task reads neither table for nothing."""
    task._state.fields_cache[Task.forecast.related.cache_name] = None  # type: ignore[attr-defined]
    task._state.fields_cache[Task.wait.related.cache_name] = None  # type: ignore[attr-defined]


def task_submit(
    *,
    tenant: Tenant,
    request: TaskSubmission,
    submitted_by: AbstractBaseUser | None,
    idempotency_key: str | None = None,
) -> tuple[Task, bool]:
    """Validate and store one task as pending, holding no quota until a cycle admits it. Returns (task,
    created). Refused (400) only if invalid or if it could never run in the pool (`CannotRunHere`).

    All or nothing: a refused request leaves no task and no event behind.
    """
    try:
        with transaction.atomic():
            task, created = _submit_one(
                tenant=tenant, request=request, submitted_by=submitted_by, idempotency_key=idempotency_key
            )
            if created:
                # Predictions are attached once the task is committed.
                hooks.tasks_submitted(task_ids=[task.pk])
            return task, created
    except IntegrityError:
        # Two retries with one key raced past step 1: the unique constraint kept one; hand that one back.
        if idempotency_key:
            existing = Task.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
            if existing is not None:
                return _same_request_or_conflict(existing, request, idempotency_key), False
        raise


@transaction.atomic
def tasks_submit_bulk(
    *,
    tenant: Tenant,
    items: list[tuple[TaskSubmission, str | None]],
    submitted_by: AbstractBaseUser | None,
) -> list[Task]:
    """Submit several tasks (e.g. a gang) in one transaction: all are stored or none is.

    Set-based, so a batch costs a fixed number of queries whatever its size: its idempotency keys in
    one read, its queues in one, each pool's models once (only where a task names models or MIG), each
    pool's quota and node sizes once, then one INSERT for the tasks and one for their events. The rules
    are those of a single submission, checked in order; the first refused task is reported at its index.
    """
    count = len(items)

    def refuse(index: int, error: ValidationError) -> BulkItemError:
        return BulkItemError(index=index, count=count, error=error)

    # 1. Keys seen before (a retried batch) and the queues named, one query each.
    keys = {key for _, key in items if key}
    seen = (
        {
            t.idempotency_key: t
            for t in Task.objects.select_related("queue").filter(tenant=tenant, idempotency_key__in=keys)
        }
        if keys
        else {}
    )
    names = {request.queue for request, _ in items}
    queues = {q.name: q for q in Queue.objects.select_related("pool").filter(tenant=tenant, name__in=names)}

    # 2. Each request on its own and against its pool; a key repeated within the batch means one task.
    known: dict[int, dict[str, bool]] = {}
    tasks: list[Task] = []
    fresh: list[tuple[int, Task, bool]] = []  # (index, unsaved task, whether it states gpu_mem_mib)
    by_key: dict[str, Task] = {}
    for index, (request, key) in enumerate(items):
        if key and key in seen:
            tasks.append(_same_request_or_conflict(seen[key], request, key))
            continue
        if key and key in by_key:
            tasks.append(_same_request_or_conflict(by_key[key], request, key))
            continue
        try:
            models = _validate_shape(request)
            queue = queues.get(request.queue)
            if queue is None:
                raise ValidationError(
                    {"queue": [f"tenant {tenant.slug!r} has no queue named {request.queue!r}"]}
                )
            _validate_against_pool(pool=queue.pool, request=request, models=models, known=known)
            task = _new_task(
                tenant=tenant, queue=queue, request=request, models=models, submitted_by=submitted_by, key=key
            )
        except ValidationError as exc:
            raise refuse(index, exc) from exc
        tasks.append(task)
        fresh.append((index, task, request.gpu_mem_mib is not None))
        if key:
            by_key[key] = task

    # 3. Refuse only what could never be admitted (each pool's quota and node sizes read once); a full
    #    quota is a wait. A gang's members are summed: a gang above the limit could never start whole.
    gangs: dict[tuple[int, str], int] = defaultdict(int)
    for pool_id in sorted({task.pool_id for _, task, _ in fresh}):
        in_pool = [(index, task, stated) for index, task, stated in fresh if task.pool_id == pool_id]
        pool = in_pool[0][1].pool
        quota = Quota.objects.filter(tenant=tenant, pool_id=pool_id).first()
        sizes = pool_node_sizes(pool_id) if quota is not None else []
        for index, task, stated in in_pool:
            if task.gang_id:
                gangs[(pool_id, task.gang_id)] += task.charge_milli
            refusal = _admission_refusal(
                quota=quota,
                tenant=tenant,
                pool=pool,
                task=task,
                mem_stated=stated,
                sizes=sizes,
                gang_asked_milli=gangs[(pool_id, task.gang_id)] if task.gang_id else 0,
            )
            if refusal is not None:
                raise refuse(index, refusal)

    # 4. Store the tasks (PostgreSQL returns their ids) and their first events, two statements.
    new_tasks = [task for _, task, _ in fresh]
    try:
        with transaction.atomic():
            tasks_insert(new_tasks, actor=user_actor(submitted_by), reason="submitted")
    except IntegrityError as exc:
        # Another request stored one of the batch's keys meanwhile; the batch's view of its keys is stale.
        raise Conflict(
            "an Idempotency-Key of this batch was used by a concurrent request; submit the batch again "
            "to get the tasks that request created"
        ) from exc
    for task in new_tasks:
        _no_forecast_yet(task)
    # One forecast job for the whole batch, after it is committed (a refused batch gets none).
    hooks.tasks_submitted(task_ids=[task.pk for task in new_tasks])
    return tasks


def task_transition(
    *,
    task: Task,
    to_state: str,
    actor: str,
    reason: str,
    now: datetime | None = None,
    exit_code: int | None = None,
    why_pending: str | None = None,
) -> Task:
    """Move a task to `to_state`: the only writer of Task.state.

    Compare-and-set on (state, version) as the caller saw them: if anything moved the task meanwhile,
    nothing is written and Conflict is raised, so two actors can never both win. Entering a final state
    gives the quota charge back and releases the task's units; returning to pending after preemption
    or loss counts a new attempt.

    A gang runs whole (docs/scheduling.md, "Gangs"): a member preempted or lost while placed takes its
    placed siblings back to pending in the same transaction (`_gang_requeue`), so the gang can be placed
    again in one piece; a member that fails ends its unfinished siblings (`_gang_fail`); a member that
    is cancelled cancels them (`_gang_cancel`). Once any member has ended, the gang can never be placed
    whole again, so no member goes back to pending: asked to, it fails instead (the returned task says
    which state it reached).
    """
    now = now or timezone.now()
    was_placed = task.state in PLACED
    with transaction.atomic():
        if to_state == Task.State.PENDING and task.state in RETRY_FROM:
            ended = _gang_ended_member(task)
            exhausted = _attempts_exhausted(task)
            if ended is not None:
                to_state, reason, why_pending = Task.State.FAILED, _cannot_run_whole(ended), None
            elif exhausted is not None:
                to_state, reason, why_pending = Task.State.FAILED, exhausted, None
        moved = _transition(
            task=task,
            to_state=to_state,
            actor=actor,
            reason=reason,
            now=now,
            exit_code=exit_code,
            why_pending=why_pending,
        )
        # `moved` is read back whole (a caller may hold a partial row, as the scheduler's victims).
        if moved.gang_id and to_state in RETRY_FROM and was_placed:
            _gang_requeue(member=moved, via=to_state, actor=actor, reason=reason, now=now)
        if moved.gang_id and to_state == Task.State.FAILED:
            _gang_fail(member=moved, actor=actor, reason=reason, now=now)
        if moved.gang_id and to_state == Task.State.CANCELLED:
            _gang_cancel(member=moved, actor=actor, reason=reason, now=now)
    return moved


# why_pending_code of a requeued task waiting out its back-off (the cycle does not see it until then).
BACKING_OFF = "backing_off"

# A task in one of these holds (or is about to hold) a place on a node.
PLACED: frozenset[str] = frozenset({Task.State.ADMITTED, Task.State.ASSIGNED, Task.State.RUNNING})

# Every event a gang writes on a member's siblings starts so: "gang member 12 was cancelled: …".
GANG_REASON_PREFIX = "gang member "


def _gang_siblings(member: Task) -> QuerySet[Task]:
    """The other members of `member`'s gang: same tenant, pool and gang id. A gang id may be used again
    once its gang has ended, so a task that ended before `member` was submitted is of an earlier gang.
    "Before" is by event id, not by time: transitions carry the caller's clock (a replay's), events are
    numbered in the order they are written."""
    submitted = TaskEvent.objects.filter(task_id=member.pk).order_by("pk").values("pk")[:1]
    ended_before = TaskEvent.objects.filter(
        task_id=OuterRef("pk"), to_state__in=FINAL, pk__lt=Subquery(submitted)
    )
    return (
        Task.objects.filter(tenant_id=member.tenant_id, pool_id=member.pool_id, gang_id=member.gang_id)
        .exclude(pk=member.pk)
        .exclude(Exists(ended_before))
        .order_by("pk")
    )


def _gang_ended_member(task: Task) -> Task | None:
    """The first member of `task`'s gang to have ended, or None (also for a task in no gang). Reads the
    task's gang back from the database: a caller may hold a partial row."""
    member = Task.objects.only("tenant_id", "pool_id", "gang_id").get(pk=task.pk)
    if not member.gang_id:
        return None
    ended: Task | None = _gang_siblings(member).filter(state__in=FINAL).order_by("finished_at", "pk").first()
    return ended


def requeue_backoff_s(*, attempt: int, base_s: float, cap_s: float) -> float:
    """How long a task requeued after its `attempt`-th run (1 = the first) waits: base, then doubling,
    capped. A task that keeps getting lost (a command that cannot start, a node that keeps dying) costs
    the fleet less each time, and a fleet-wide blip does not send every task back at once, every cycle."""
    return float(min(cap_s, base_s * 2 ** max(attempt - 1, 0)))


def _attempts_exhausted(task: Task) -> str | None:
    """The failure reason of a task that has used its `WHALEGEN_MAX_ATTEMPTS` runs, with each run's end;
    None while it may run again. Reads the attempt count back (a caller may hold a partial row)."""
    attempts = Task.objects.filter(pk=task.pk).values_list("attempts", flat=True).first() or 0
    runs = attempts + 1  # the run that just ended is number attempts + 1
    limit = settings.WHALEGEN_MAX_ATTEMPTS
    if runs < limit:
        return None
    ends = TaskEvent.objects.filter(task_id=task.pk, to_state__in=RETRY_FROM).order_by("pk")
    history = "; ".join(
        f"{number}: {event.to_state} ({event.reason[:70]})" for number, event in enumerate(ends, start=1)
    )
    return f"gave up after {runs} attempts (WHALEGEN_MAX_ATTEMPTS={limit}): {history}"[:500]


def _cannot_run_whole(ended: Task) -> str:
    return f"{GANG_REASON_PREFIX}{ended.pk} already ended ({ended.state}); the gang cannot run whole again"


def _gang_requeue(*, member: Task, via: str, actor: str, reason: str, now: datetime) -> None:
    """Requeue the placed siblings of a gang member that was just preempted or lost.

    Without this the member waits in pending for a whole gang (`gang_incomplete`) that never comes, its
    quota charge held, while its siblings run on without it (a distributed job missing a rank). A
    sibling moved by another writer meanwhile keeps that writer's move. When a member of the gang has
    already ended, the siblings fail instead of going back to pending (the gang can never be whole).
    """
    siblings = _gang_siblings(member).filter(state__in=PLACED)
    ended = _gang_ended_member(member)
    why = f"{GANG_REASON_PREFIX}{member.pk} was {via}: {reason}"[:500]
    for sibling in siblings:
        try:
            with transaction.atomic():
                stopped = _transition(task=sibling, to_state=via, actor=actor, reason=why, now=now)
                if ended is not None:
                    _transition(
                        task=stopped,
                        to_state=Task.State.FAILED,
                        actor=actor,
                        reason=_cannot_run_whole(ended),
                        now=now,
                    )
                    continue
                _transition(
                    task=stopped,
                    to_state=Task.State.PENDING,
                    actor=actor,
                    reason="requeued with its gang",
                    now=now,
                    why_pending=f"requeued with its gang: {why}"[:500],
                )
        except Conflict:
            continue


def _gang_fail(*, member: Task, actor: str, reason: str, now: datetime) -> None:
    """End the unfinished siblings of a gang member that failed: placed ones fail with it (their ranks
    cannot go on without it), waiting ones are cancelled (the gang can never be whole again, and they
    would hold their quota charge while waiting forever as `gang_incomplete`)."""
    why = f"{GANG_REASON_PREFIX}{member.pk} failed: {reason}"[:500]
    for sibling in _gang_siblings(member).exclude(state__in=FINAL):
        running = sibling.state in (Task.State.ASSIGNED, Task.State.RUNNING)
        to_state = Task.State.FAILED if running else Task.State.CANCELLED
        try:
            with transaction.atomic():
                _transition(task=sibling, to_state=to_state, actor=actor, reason=why, now=now)
        except Conflict:
            continue


def _gang_cancel(*, member: Task, actor: str, reason: str, now: datetime) -> None:
    """Cancel the unfinished siblings of a cancelled gang member, running or waiting: a co-scheduled job
    is one job, none of its ranks can run on without the cancelled one nor be placed whole again. The
    actor is the cancel's (the user who asked), the reason names the member."""
    why = f"{GANG_REASON_PREFIX}{member.pk} was cancelled: {reason}"[:500]
    for sibling in _gang_siblings(member).exclude(state__in=FINAL):
        try:
            with transaction.atomic():
                _transition(task=sibling, to_state=Task.State.CANCELLED, actor=actor, reason=why, now=now)
        except Conflict:
            continue


def _transition(
    *,
    task: Task,
    to_state: str,
    actor: str,
    reason: str,
    now: datetime,
    exit_code: int | None = None,
    why_pending: str | None = None,
) -> Task:
    check_transition(task.state, to_state)
    updates: dict[str, Any] = {"state": to_state, "version": F("version") + 1, "updated_at": now}
    code = ""  # of the task's TaskWait row, once it is pending
    if to_state == Task.State.RUNNING:
        updates["started_at"] = now
    if to_state in FINAL:
        updates["finished_at"] = now
    if exit_code is not None:
        updates["exit_code"] = exit_code
    if to_state == Task.State.FAILED:
        updates["failure_reason"] = reason[:500]
    if to_state == Task.State.PENDING and task.state in RETRY_FROM:
        updates["attempts"] = F("attempts") + 1
        # Back off before the next run (the snapshot skips the task until then); say so where users look.
        attempt = task.attempts + 1
        delay_s = requeue_backoff_s(
            attempt=attempt,
            base_s=settings.WHALEGEN_REQUEUE_BACKOFF_S,
            cap_s=settings.WHALEGEN_REQUEUE_BACKOFF_MAX_S,
        )
        if delay_s > 0:  # WHALEGEN_REQUEUE_BACKOFF_S=0 turns back-off off
            not_before = now + timedelta(seconds=delay_s)
            updates["not_before_at"] = not_before
            code = BACKING_OFF
            backing_off = (
                f"backing off after attempt {attempt} until {not_before.isoformat(timespec='seconds')}"
            )
            # The cause first (what users and tests read), the back-off kept whole at the end.
            why_pending = f"{(why_pending or reason)[: 500 - len(backing_off) - 2]}; {backing_off}"
    with transaction.atomic():
        moved = Task.objects.filter(pk=task.pk, state=task.state, version=task.version).update(**updates)
        if moved != 1:
            current = Task.objects.filter(pk=task.pk).values_list("state", flat=True).first()
            raise Conflict(
                f"task {task.pk} changed while you acted on it (you saw {task.state}, it is now {current}); "
                "reload and retry"
            )
        TaskEvent.objects.create(
            task=task, from_state=task.state, to_state=to_state, actor=actor, reason=reason
        )
        if to_state == Task.State.PENDING:
            # Back in the queue: the words of its last wait no longer hold; the next cycle writes its own.
            task_waits_write([TaskWait(task_id=task.pk, why=(why_pending or "")[:500], code=code)])
        if to_state in FINAL or to_state in RETRY_FROM:
            # Releasing the assignment frees its units: a unit's holder is the live assignment listing it.
            # `assignments` is the relation scheduling's Assignment declares to Task (apps.LAYERS: no import).
            live = task.assignments.filter(released_at__isnull=True)
            # The nodes that held it list it no more (or list it to stop): their agents must hear of it.
            hooks.nodes_changed(live.values_list("node_id", flat=True))
            live.update(released_at=now, release_reason=reason[:200])
    task.refresh_from_db()
    return task


def task_preempt(
    *,
    task: Task,
    actor: str,
    reason: str,
    requeued: str,
    now: datetime,
    node_ids: Collection[int] | None = None,
) -> bool:
    """Preempt a placed task and put it back in its queue: placed → preempted → pending in one
    transaction (the attempt counted, its units released; a gang's placed siblings go with it), so a
    crash between the two moves never leaves it preempted in no queue. The nodes that held it
    (`node_ids`, read from its live assignment when not given) move their version: the next snapshot
    sees them changed, and the agent stops the task once its node's desired state no longer lists it.

    `reason` is the preemption's (its event and the task's why-pending); `requeued` the requeue event's.
    False, with nothing written, when another writer moved the task first (it finished, was cancelled,
    or another preemption won): theirs stands.
    """
    if node_ids is None:
        node_ids = list(task.assignments.filter(released_at__isnull=True).values_list("node_id", flat=True))
    try:
        with transaction.atomic():
            moved = task_transition(
                task=task, to_state=Task.State.PREEMPTED, actor=actor, reason=reason, now=now
            )
            task_transition(
                task=moved,
                to_state=Task.State.PENDING,
                actor=actor,
                reason=requeued,
                now=now,
                why_pending=reason[:500],
            )
    except Conflict:
        return False
    Node.objects.filter(pk__in=node_ids).update(version=F("version") + 1)
    return True


IDLE_ACTOR = "system:idle_check"  # the idle check's and idle reclaims' events name it


def task_preempt_idle(*, task: Task, reason: str, now: datetime) -> bool:
    """Preempt and requeue an idle task (`task_preempt`), clearing its idle flag: back in the queue it holds
    no GPU to idle on. False when it moved meanwhile (finished, cancelled, preempted by a cycle): nothing to
    reclaim. The idle check (apps.fleet.idle) and an approved reclaim request (apps.approvals) call it."""
    if not task_preempt(
        task=task, actor=IDLE_ACTOR, reason=reason, requeued="requeued after idle reclaim", now=now
    ):
        return False
    Task.objects.filter(pk=task.pk).update(idle_flagged_at=None)
    return True


def task_note(*, task_id: int, actor: str, reason: str) -> None:
    """An event that records no move: a state's own from/to, so the task's history tells the owner."""
    state = Task.objects.filter(pk=task_id).values_list("state", flat=True).first()
    if state is not None:
        TaskEvent.objects.create(
            task_id=task_id, from_state=state, to_state=state, actor=actor, reason=reason
        )


def task_cancel(*, task: Task, by: AbstractBaseUser | None, reason: str = "") -> Task:
    """Cancel a task, and with it the rest of its gang.

    A gang member the plane already cancelled with its gang is answered as it is: the caller asked for
    what already holds (a script cancelling every member of a gang is not told its second cancel was a
    conflict). Any other final task, a repeated cancel included, is refused (IllegalTransition, 409).
    """
    if task.state == Task.State.CANCELLED and task.gang_id:
        last = task.events.filter(to_state=Task.State.CANCELLED).order_by("-pk").first()
        if last is not None and last.reason.startswith(GANG_REASON_PREFIX):
            return task
    for attempt in range(CANCEL_TRIES):
        try:
            return task_transition(
                task=task,
                to_state=Task.State.CANCELLED,
                actor=user_actor(by),
                reason=reason or "cancelled by request",
            )
        except Conflict:
            # The task moved while we acted (assigned -> running by its agent's report): the user's
            # intent still holds, so read it again and cancel what it is now; a final task stays refused.
            if attempt == CANCEL_TRIES - 1:
                raise
            task.refresh_from_db()
    raise AssertionError("unreachable")


CANCEL_TRIES = 3


def tasks_transition_bulk(
    *,
    tasks: Sequence[tuple[int, int]],
    from_state: str,
    path: Sequence[str],
    actor: str,
    reasons: Mapping[int, Sequence[str]] | Callable[[], Mapping[int, Sequence[str]]],
    now: datetime | None = None,
    deferred: list[Callable[[], None]] | None = None,
) -> int:
    """Move many tasks from `from_state` along `path` (e.g. admitted, then assigned) in a few statements.

    The scheduler's commit moves thousands of tasks per cycle; one `task_transition` each would cost five
    queries per task. Each step is still checked against the state machine and each move leaves one
    event per step (`reasons[pk]`, one per step). Compare-and-set on (state, version) per task, grouped by
    version: every UPDATE must touch exactly the rows it names; if not, Conflict is raised and the
    caller's transaction rolls back (the scheduler's commit then takes its locked path, which locks and
    compares the rows first). Only moves that neither finish nor requeue a task are allowed: those
    release units and quota and stay with `task_transition`.

    `reasons` may be a function returning them: it is called once the UPDATE has gone out, so a caller in
    a pipeline builds its thousands of sentences while the server moves the rows.

    `deferred`: a caller that sends these statements inside a psycopg pipeline (the scheduler's commit,
    which builds its next statement while the server runs this one) learns the row counts only once the
    pipeline has synced; it passes a list, gets the compare-and-set check appended instead of run, and
    runs it after. A failed check raises Conflict then, and the caller's transaction must roll back.

    The two halves, `tasks_move_bulk` and `task_events_bulk`, are for a caller that sends the moves of
    several batches before their events (the scheduler, while its engine is still placing tasks).
    """
    now = now or timezone.now()
    with transaction.atomic():
        check = tasks_move_bulk(tasks=tasks, from_state=from_state, path=path, now=now)
        if tasks:
            task_events_bulk(
                tasks=[pk for pk, _ in tasks], from_state=from_state, path=path, actor=actor, reasons=reasons
            )
        if deferred is None:
            check()  # inside the savepoint: a conflict undoes this call's writes
    if deferred is not None:
        deferred.append(check)
    return len(tasks)


def tasks_move_bulk(
    *, tasks: Sequence[tuple[int, int]], from_state: str, path: Sequence[str], now: datetime
) -> Callable[[], None]:
    """`tasks_transition_bulk`'s moves without their events: sends the UPDATEs and returns their
    compare-and-set check (Conflict unless each moved exactly the rows it names), to run once they have
    answered. The caller writes the events (`task_events_bulk`) in the same transaction."""
    states = [from_state, *path]
    for before, after in pairwise(states):
        check_transition(before, after)
        if after in FINAL or after in RETRY_FROM or after == Task.State.PENDING:
            raise ValueError(f"bulk moves cannot enter {after}; use task_transition")
    counts: list[tuple[Callable[[], int], int]] = []  # (rows the UPDATE moved, once known; rows it must move)

    def check() -> None:
        for moved_of, wanted in counts:
            moved = moved_of()
            if moved != wanted:
                raise Conflict(f"{wanted - moved} of {wanted} tasks changed while the scheduler moved them")

    if not tasks:
        return check
    by_version: dict[int, list[int]] = {}
    for pk, version in tasks:
        by_version.setdefault(version, []).append(pk)
    to_state = states[-1]
    if connection.vendor == "postgresql":
        # Written out, not compiled by the ORM: the scheduler sends a batch every few hundred placements
        # while its engine runs, and compiling the same UPDATE cost it a millisecond each time. Ids go as
        # one array literal (thousands of IN placeholders cost the client more than the UPDATE costs the
        # server); `id = ANY(array)` is an index (or hashed) condition, where `id IN (SELECT unnest(…))`
        # let the planner pick a join that took 6.2 s for 6,780 rows on a freshly filled, unanalysed table.
        started = ", started_at = %(now)s" if to_state == Task.State.RUNNING else ""
        sql = (
            f"UPDATE {Task._meta.db_table} SET state = %(to)s, version = version + %(steps)s, "
            f"updated_at = %(now)s{started} "
            "WHERE state = %(from)s AND version = %(version)s AND id = ANY(%(ids)s::bigint[])"
        )
        for version, pks in by_version.items():
            # On a cursor of our own: the row count is read by the check, once the pipeline has synced.
            cursor = connection.cursor()
            cursor.execute(
                sql,
                {
                    "to": to_state,
                    "steps": len(path),
                    "now": now,
                    "from": from_state,
                    "version": version,
                    "ids": "{" + ",".join(map(str, pks)) + "}",
                },
            )
            counts.append((lambda cursor=cursor: cursor.rowcount, len(pks)))
        return check
    updates: dict[str, Any] = {
        "state": to_state,
        "version": F("version") + len(path),
        "updated_at": now,
    }
    if to_state == Task.State.RUNNING:
        updates["started_at"] = now
    for version, pks in by_version.items():
        moved = Task.objects.filter(state=from_state, version=version, pk__in=pks).update(**updates)
        counts.append((lambda moved=moved: moved, len(pks)))
    return check


def task_events_bulk(
    *,
    tasks: Sequence[int],
    from_state: str,
    path: Sequence[str],
    actor: str,
    reasons: Mapping[int, Sequence[str]] | Callable[[], Mapping[int, Sequence[str]]],
) -> None:
    """The events of `tasks_move_bulk`'s moves: one per step and task, `reasons[pk]` giving each step's."""
    steps = list(pairwise([from_state, *path]))
    sentences = reasons() if callable(reasons) else reasons
    if connection.vendor == "postgresql":
        # Thousands of events per cycle: one INSERT … SELECT, no model instances. One JSON object per
        # task with its steps' reasons (json.dumps runs in C; psycopg dumps a list of strings element by
        # element), read as `json`, not `jsonb` (read once: converting first is work for nothing), each
        # joined to the path's steps in the server: 13,560 events of 6,780 tasks cost this process 6 ms
        # and the server 48 against 17 and 58 as one object per event (medians of five, rolled back).
        names = [f"r{i}" for i in range(1, len(steps) + 1)]
        values = ", ".join(f"(%s, %s, {i})" for i in range(1, len(steps) + 1))
        if len(steps) == 2:  # the scheduler's pending → admitted → assigned: a literal is built at once
            rows = [{"t": pk, "r1": (r := sentences[pk])[0][:500], "r2": r[1][:500]} for pk in tasks]
        else:
            rows = [dict(zip(names, (r[:500] for r in sentences[pk]), strict=True), t=pk) for pk in tasks]
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {TaskEvent._meta.db_table} "
                "(task_id, from_state, to_state, reason, actor, created_at) "
                f"SELECT e.t, v.f, v.s, (ARRAY[{', '.join('e.' + n for n in names)}])[v.i], %s, %s "
                f"FROM json_to_recordset(%s::json) AS e(t bigint, {', '.join(n + ' text' for n in names)}) "
                f"CROSS JOIN (VALUES {values}) AS v(f, s, i)",
                # created_at is when the event is written, as auto_now_add would set it.
                [actor, timezone.now(), json.dumps(rows), *(state for step in steps for state in step)],
            )
        return
    events = [
        (pk, before, after, reason[:500])
        for pk in tasks
        for (before, after), reason in zip(steps, sentences[pk], strict=True)
    ]
    TaskEvent.objects.bulk_create(
        [TaskEvent(task_id=t, from_state=b, to_state=a, actor=actor, reason=r) for t, b, a, r in events]
    )
