"""Queues, quotas, tasks and what history says about them (profiles)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.common.models import TimestampedModel
from apps.inventory.models import Pool
from apps.tenants.models import Tenant


class Quota(TimestampedModel):
    """A tenant's share of a pool, in milli-GPUs (1000 = one whole GPU).

    Only admitted work holds quota (docs/scheduling.md, "Admission"): a pending task holds none, however
    long it waits. Submission refuses only what could never be admitted (above `guaranteed + borrow
    limit` even with all the tenant's work ended); the cycle admits a task only when what the tenant's
    admitted, assigned and running tasks hold plus the task's ask stays within the limit, checked under
    this row's lock. What is held is read from those tasks (`apps.scheduling.selectors.live_usage`),
    not kept in a counter that could drift from them.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="quotas")
    guaranteed_milli = models.PositiveIntegerField()
    borrow_limit_milli = models.PositiveIntegerField(default=0)
    gpu_mem_limit_mib = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["tenant__slug", "pool__name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "pool"], name="quota_tenant_pool_unique")]

    def __str__(self) -> str:
        return f"{self.tenant_id}@{self.pool_id}"

    @property
    def limit_milli(self) -> int:
        return self.guaranteed_milli + self.borrow_limit_milli


class Queue(TimestampedModel):
    """A tenant's ordered line of tasks into one pool."""

    class IdleReclaim(models.TextChoices):
        """What the idle check does with this queue's tasks that hold GPUs and leave them idle
        (docs/idle-reclaim.md)."""

        OFF = "off", "off: not watched"
        NOTIFY = "notify", "notify: flag the task and tell its owner"
        PREEMPT = "preempt", "preempt: notify, then preempt when pending work could use the GPU"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="queues")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="queues")
    name = models.SlugField(max_length=64)
    default_priority = models.IntegerField(default=0)
    # Share of the tenant's capacity under dominant-resource fair share, relative to its other queues.
    weight = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    idle_reclaim = models.CharField(max_length=8, choices=IdleReclaim.choices, default=IdleReclaim.NOTIFY)
    # The OCI image a task of this queue runs when it names none (container pools); blank = none: such a
    # task must name its own. Copied onto the task at submission, so changing it moves no queued task.
    default_image = models.CharField(max_length=512, blank=True)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="queue_tenant_name_unique")]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class Task(TimestampedModel):
    class State(models.TextChoices):
        PENDING = "pending", "pending"
        ADMITTED = "admitted", "admitted"
        ASSIGNED = "assigned", "assigned"
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"
        PREEMPTED = "preempted", "preempted"
        LOST = "lost", "lost"

    class Isolation(models.TextChoices):
        ANY = "any", "any"
        MIG = "mig", "MIG instance"
        MPS = "mps", "MPS share"
        EXCLUSIVE = "exclusive", "exclusive GPU"

    class Kind(models.TextChoices):
        TRAINING = "training", "training"
        INFERENCE = "inference", "inference"
        BATCH = "batch", "batch"
        INTERACTIVE = "interactive", "interactive"

    class SlaClass(models.TextChoices):
        ONLINE = "online", "online"
        BATCH = "batch", "batch"

    # No index of their own on tenant and pool: the (tenant, state) and (pool, state) indexes below lead
    # with them and serve every lookup by either alone. Each index is written on every state change (the
    # scheduler's commit moves thousands of tasks a cycle), so the task table keeps only the ones queries use.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="tasks", db_index=False)
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="tasks")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="tasks", db_index=False)
    # Not indexed: no query looks tasks up by submitter, and each task move that is not a heap-only update
    # (a state change) wrote an entry into it (docs/notes/cycle-speed.md, "Speed round 7"). Deleting a user,
    # an admin's rare act, scans the task table to clear it.
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tasks",
        db_index=False,
    )
    name = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)  # indexed in Meta
    # Compare-and-set counter: every state change is `UPDATE … WHERE version = v`.
    version = models.PositiveBigIntegerField(default=0)

    # Requests. gpu_milli is per GPU: 1000 is a whole GPU; below 1000 only a single GPU can be shared.
    gpu_count = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    gpu_milli = models.PositiveSmallIntegerField(
        default=1000, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )
    gpu_mem_mib = models.PositiveIntegerField(null=True, blank=True)  # per GPU; None = whatever the unit has
    cpu_milli = models.PositiveIntegerField(default=1000)
    host_mem_mib = models.PositiveBigIntegerField(default=4096)
    allowed_gpu_models = models.JSONField(default=list, blank=True)  # catalogue names; empty = any
    isolation = models.CharField(max_length=10, choices=Isolation.choices, default=Isolation.ANY)
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.BATCH)
    sla_class = models.CharField(max_length=8, choices=SlaClass.choices, default=SlaClass.BATCH)
    priority = models.IntegerField()
    preemptible = models.BooleanField(default=True)
    gang_id = models.CharField(max_length=100, blank=True)  # indexed in Meta
    gang_size = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    # How the task runs on its host: the pool's runtime at submission (later changes to the pool move no
    # submitted task). Rows from before runtimes existed ran as host processes.
    runtime = models.CharField(max_length=10, choices=Pool.Runtime.choices, default=Pool.Runtime.PROCESS)
    # The OCI image (container runtime): the task's own or its queue's default at submission; blank for
    # a process run. `command` is the argv inside it.
    image = models.CharField(max_length=512, blank=True)
    command = models.JSONField(default=list, blank=True)  # argv, not a shell string
    # Secrets live here (tokens, keys): stored in the database as given, sent only to the node that runs
    # the task (its desired state); every other reader (API, CLI, dashboard, admin) shows `env_keys`.
    env = models.JSONField(default=dict, blank=True)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    # The directory on the GPU host the command starts in (absolute); blank = the run's own directory.
    working_dir = models.CharField(max_length=1024, blank=True)
    profile_key = models.CharField(max_length=200, blank=True)
    idempotency_key = models.CharField(max_length=200, blank=True)  # blank = none given

    # Life.
    attempts = models.PositiveIntegerField(default=0)
    # A requeued task (lost, preempted) backs off: no cycle places it before this instant.
    not_before_at = models.DateTimeField(null=True, blank=True)
    # Why it waits and when it should start live in TaskWait (the properties below read them).
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # Why a failed task failed: the reason of the event that failed it (launcher error, exit status,
    # attempts exhausted…); blank for every other state.
    failure_reason = models.CharField(max_length=500, blank=True)
    # Set by the idle check (apps/fleet/idle.py) while the running task's GPUs have stayed below
    # WHALEGEN_IDLE_UTIL_PCT for WHALEGEN_IDLE_AFTER_S: the instant it was flagged. Cleared when the GPUs
    # get busy again or the task stops running.
    idle_flagged_at = models.DateTimeField(null=True, blank=True)

    # Forecasts, filled by the forecasting app.
    predicted_duration_p50_s = models.FloatField(null=True, blank=True)
    predicted_duration_p90_s = models.FloatField(null=True, blank=True)
    predicted_gpu_mem_peak_mib = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="task_tenant_idempotency_key_unique",
            ),
            models.CheckConstraint(
                condition=models.Q(gpu_milli=1000) | models.Q(gpu_count=1),
                name="task_fractional_gpu_is_single",
            ),
        ]
        # `state` and `gang_id` as Meta indexes, not `db_index=True`: on PostgreSQL that also made a
        # `varchar_pattern_ops` twin of each for LIKE 'prefix%', which no query runs (gang and state
        # lookups are exact; the admin's search is a case-insensitive contains, which neither serves).
        indexes = [
            models.Index(fields=["tenant", "state"]),
            models.Index(fields=["pool", "state"]),
            models.Index(fields=["state"], name="task_state_idx"),
            # Only gang members: a row that is not one has no entry, so moving it (a cycle moves thousands
            # of tasks; `state` is indexed, so none of those updates is heap-only) writes none either.
            models.Index(fields=["gang_id"], condition=~models.Q(gang_id=""), name="task_gang_id_idx"),
        ]

    def __str__(self) -> str:
        return f"task {self.pk} ({self.state})"

    @property
    def env_keys(self) -> list[str]:
        """The names of the task's environment variables, never their values (they may be secrets)."""
        return sorted(self.env or {})

    @property
    def charge_milli(self) -> int:
        """What this task holds against its quota once admitted, until it ends or goes back to pending."""
        return self.gpu_count * self.gpu_milli

    @property
    def charge_mem_mib(self) -> int:
        return self.gpu_count * (self.gpu_mem_mib or 0)

    # Why a pending task waits, its machine code and its estimated start: the task's TaskWait row, shown
    # only while the task is pending (a row outlives the wait it describes). A list of tasks reads them
    # with `select_related("wait")`; otherwise each first read is a query.
    @property
    def why_pending(self) -> str:
        wait = self._wait()
        if wait is not None:
            return wait.why
        return FIRST_CYCLE if self.state == Task.State.PENDING else ""

    @property
    def why_pending_code(self) -> str:
        """The solver's machine code for why_pending (whalegen.placement.types.Outcome values)."""
        wait = self._wait()
        return "" if wait is None else wait.code

    @property
    def predicted_start_at(self) -> datetime | None:
        wait = self._wait()
        return None if wait is None else wait.start_at

    def _wait(self) -> TaskWait | None:
        """The task's TaskWait row while it is pending; None otherwise or when no cycle has written one."""
        if self.state != Task.State.PENDING:
            return None
        try:
            return self.wait  # type: ignore[no-any-return]
        except TaskWait.DoesNotExist:
            return None


# What a pending task no cycle has looked at yet waits for (it has no TaskWait row).
FIRST_CYCLE = "waiting for the first scheduling cycle"


class TaskWait(models.Model):
    """The scheduler's latest word on a pending task: why it waits, as a sentence and a machine code, and
    when it should start.

    A table of its own, not columns of Task: every cycle rewrites it for most of a pool's backlog, and a
    new version of a task row writes every index of that table (none of those updates stays on its page
    once the cycle's moves have filled it), where a new version of this row writes one: about half the
    server's time for a large backlog (docs/notes/cycle-speed.md, rounds 16 and 17). A row is written
    when its task enters pending (the transition's sentence) and by each cycle; it is left behind when
    the task moves on and read only while the task is pending (Task.why_pending).

    No database constraint on `task` (index kept: it is the key): the check would lock each task row the
    cycle names (FOR KEY SHARE) on every cycle. Every writer names a task it has just read or moved, and
    tasks are never deleted but by the ORM, which deletes this row with them.
    """

    task = models.OneToOneField(
        Task, on_delete=models.CASCADE, primary_key=True, related_name="wait", db_constraint=False
    )
    why = models.CharField(max_length=500, blank=True)
    code = models.CharField(max_length=32, blank=True)
    start_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.task_id}: {self.code or '-'} {self.why}"


class TaskEvent(models.Model):
    # No database constraint (index kept): every writer of an event holds its task row, locked or updated,
    # in the same transaction, and tasks are never deleted; the check of each of the cycle's ~13,560
    # events at COMMIT was measurable (docs/notes/cycle-speed.md, "Speed round 6").
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events", db_constraint=False)
    # Not indexed: events are read per task (through `task`, then sorted), never by time across tasks,
    # and the index cost an entry per event, two per placement (docs/notes/cycle-speed.md, "Speed round 7").
    created_at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=10, choices=Task.State.choices, blank=True)  # blank on submit
    to_state = models.CharField(max_length=10, choices=Task.State.choices)
    # Who moved it: "user:<name>", "scheduler", "agent:<node>", "system:<job>".
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.task_id}: {self.from_state or '∅'} → {self.to_state}"


class TaskProfile(models.Model):
    """What history says about tasks of one tenant and profile key."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="task_profiles")
    profile_key = models.CharField(max_length=200)
    sample_count = models.PositiveIntegerField(default=0)  # finished runs folded into the durations
    duration_p50_s = models.FloatField(null=True, blank=True)
    duration_p90_s = models.FloatField(null=True, blank=True)
    # From agent telemetry (fleet TaskSample, per task and GPU; GpuSample for the GPU's duty cycle).
    gpu_mem_peak_mib = models.PositiveIntegerField(null=True, blank=True)
    gpu_mem_typical_mib = models.PositiveIntegerField(null=True, blank=True)  # median of the samples
    gpu_mem_p95_mib = models.PositiveIntegerField(null=True, blank=True)
    gpu_util_mean = models.FloatField(null=True, blank=True)  # 0..1
    gpu_util_p95 = models.FloatField(null=True, blank=True)  # 0..1
    # Goh–Barabási (σ − μ)/(σ + μ) of the duty cycle: −1 steady, 0 Poisson-like, → 1 bursty.
    gpu_util_burstiness = models.FloatField(null=True, blank=True)
    # whalegen.forecast.profiles.MemoryPattern: "static", "growing", "fluctuating" or "unknown".
    mem_growth = models.CharField(max_length=32, blank=True)
    sla_class = models.CharField(max_length=8, blank=True)  # the most common among the key's recent tasks
    telemetry_samples = models.PositiveIntegerField(default=0)  # (task, GPU, instant) samples folded
    telemetry_tasks = models.PositiveIntegerField(default=0)  # tasks those samples came from
    last_sample_at = models.DateTimeField(null=True, blank=True)
    util_curve = models.JSONField(default=list, blank=True)
    # whalegen.forecast.profiles.classify_bound over the key's unshared busy NVML samples
    # (docs/notes/goodput-design.md §10), written by the profile refresh: a BoundClass value ("compute-bound",
    # "bandwidth-bound", "balanced", "unknown"), the speed rule's exponent 0 (bandwidth) … 1 (FLOPS), the
    # samples' mean SM %, how many, and the share of speed lost beside a copy of itself (0 … 1).
    bound_class = models.CharField(max_length=16, blank=True)
    compute_exponent = models.FloatField(null=True, blank=True)
    bound_sm_util_pct = models.FloatField(null=True, blank=True)
    bound_samples = models.PositiveIntegerField(default=0)
    interference_sensitivity = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id", "profile_key"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "profile_key"], name="profile_tenant_key_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.profile_key}"
