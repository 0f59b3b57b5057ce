"""What the scheduling loop commits (assignments) and the record it keeps of each cycle."""

from __future__ import annotations

from django.db import models

from apps.inventory.models import ComputeUnit, Node, Pool
from apps.scheduling.fields import UnitIdsField
from apps.workloads.models import Task


class Cycle(models.Model):
    """One scheduling pass over a pool: snapshot → solve → commit."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="cycles")
    policy = models.CharField(max_length=32)
    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    tasks_considered = models.PositiveIntegerField(default=0)
    tasks_placed = models.PositiveIntegerField(default=0)
    tasks_preempted = models.PositiveIntegerField(default=0)
    # Decisions that lost a compare-and-set race at commit and were skipped (never double-booked).
    conflicts = models.PositiveIntegerField(default=0)
    snapshot_ms = models.FloatField(null=True, blank=True)
    solve_ms = models.FloatField(null=True, blank=True)
    commit_ms = models.FloatField(null=True, blank=True)
    # Free-form figures from the solver (fragmentation before/after, reasons by count …).
    stats = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"cycle {self.pk} on {self.pool_id}"


class PoolCycleTotals(models.Model):
    """Running totals of a pool's cycles, added to by the cycle that writes each `Cycle` row.

    Why not sum the `Cycle` rows: operators scrape these as counters every few seconds, and a sum over a
    month of cycles costs seconds; the totals also survive pruning old cycle records.
    """

    pool = models.OneToOneField(Pool, on_delete=models.CASCADE, primary_key=True, related_name="cycle_totals")
    cycles = models.BigIntegerField(default=0)
    tasks_considered = models.BigIntegerField(default=0)
    tasks_placed = models.BigIntegerField(default=0)
    tasks_preempted = models.BigIntegerField(default=0)
    conflicts = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"cycle totals of pool {self.pool_id}"


class Assignment(models.Model):
    """The binding of a task to a node and the compute units it holds there."""

    # No database constraints on the three references (`db_constraint=False`, indexes kept): the cycle
    # inserts thousands of assignments in one statement and each row's three deferred foreign-key checks
    # ran at COMMIT (with the events' check, ~34,000 per bench cycle, 0.1-0.4 s: docs/notes/cycle-speed.md,
    # "Speed round 6"). Integrity holds without them: the cycle's commit, the only writer, has locked the
    # task and node rows (FOR UPDATE) and created the cycle row in the same transaction; tasks are never
    # deleted (the admin refuses, and tenants, queues and pools protect theirs); a node is deleted only
    # after locking it (`NodeAdmin`), so Django's collector, which applies CASCADE / PROTECT / SET_NULL
    # itself, sees every assignment committed before it.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="assignments", db_constraint=False)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="assignments", db_constraint=False)
    # The compute units held, by id (a list in the row, not a link table: see `UnitIdsField` for why).
    # Ids of units a re-carve has since deleted stay here; their history is in `accounting.HeldUnit`.
    unit_ids = UnitIdsField(default=list, blank=True)
    cycle = models.ForeignKey(
        Cycle,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="assignments",
        db_constraint=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when the task stops holding the units (finished, preempted, lost). One live row per task.
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=200, blank=True)
    # Admitted above the tenant's guarantee: the first capacity an owner reclaims.
    borrowed = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["task"],
                condition=models.Q(released_at__isnull=True),
                name="assignment_one_live_per_task",
            ),
        ]
        indexes = [
            # The live assignments of a node (its desired state, the node's running tasks) and of a pool's
            # nodes (the cycle's snapshot). Without it the planner ANDs the node index with the
            # live-per-task index above and walks the whole live set once per node: the snapshot's read of
            # 6,780 running tasks on 1,213 nodes took 0.7 s, growing with nodes × running tasks
            # (docs/notes/cycle-speed.md, "Speed round 7").
            models.Index(
                fields=["node"], condition=models.Q(released_at__isnull=True), name="assignment_live_by_node"
            ),
            # Usage in a range (`apps.accounting.selectors._usage`: a pool's budgets, read by every cycle of a
            # pool with a budget; the usage reports) keeps the assignments released after the range's start
            # or not released: without it every cycle read the whole assignment history. Its `IS NULL` and
            # `>` arms are two scans of this one index (tests/apps/accounting/test_usage_index.py).
            models.Index(fields=["released_at"], name="assignment_released_at"),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} on node {self.node_id}"

    @property
    def units(self) -> models.QuerySet[ComputeUnit]:
        """The units held that still exist, in the units' own order (gpu, id)."""
        return ComputeUnit.objects.filter(pk__in=self.unit_ids)


class Repartition(models.Model):
    """A GPU re-carved by a cycle for a pending task: the claim that holds the GPU for that task until
    the node's agent reports the new layout applied (then a cycle binds the task to `unit`; a task on
    several GPUs holds a claim on each and binds once every one of them is applied). Or, with no
    task and state `ahead`, an idle GPU re-carved ahead of the pool's arrivals forecast, with the reason
    (closed when written: nobody waits on it).

    The new layout is the GPU's `ComputeUnit`s themselves (the desired state the agent pulls is built
    from them); this row remembers for whom, which generation of the node's desired state carries it,
    and how the claim ended.
    """

    class State(models.TextChoices):
        WAITING = "waiting", "waiting for the agent"
        BOUND = "bound", "bound"
        ABANDONED = "abandoned", "abandoned"
        AHEAD = "ahead", "re-carved ahead of the forecast"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="repartitions")
    gpu = models.ForeignKey("inventory.Gpu", on_delete=models.CASCADE, related_name="repartitions")
    # None for a re-carve ahead of the forecast (state `ahead`).
    task = models.ForeignKey(
        Task, null=True, blank=True, on_delete=models.CASCADE, related_name="repartitions"
    )
    # The instance planned for the task; SET_NULL so a later re-carve cannot be blocked by history.
    unit = models.ForeignKey(ComputeUnit, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    cycle = models.ForeignKey(Cycle, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    generation = models.PositiveBigIntegerField()  # the node's desired-state generation with the layout
    layout = models.JSONField(default=list)  # [[profile, start], …] by start
    state = models.CharField(max_length=10, choices=State.choices, default=State.WAITING, db_index=True)
    reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # A task on several GPUs holds one claim on each.
            models.UniqueConstraint(
                fields=["task", "gpu"],
                condition=models.Q(state="waiting"),
                name="repartition_one_open_claim_per_task_gpu",
            ),
        ]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} for task {self.task_id} @ {self.generation}: {self.state}"
