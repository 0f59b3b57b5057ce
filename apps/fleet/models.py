"""What the plane keeps about each node's agent: its session, desired-state generation, the reports it
sent (for idempotency), what it says about each task it was given, GPU events and telemetry samples;
and how nodes join: join tokens and each joined node's approval (docs/agent.md, "Joining")."""

from __future__ import annotations

from django.db import models

from apps.inventory.models import Cluster, Gpu, Node, Pool
from apps.workloads.models import Task


class NodeAgent(models.Model):
    """One row per node whose agent has registered at least once."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="agent")
    hostname = models.CharField(max_length=255, blank=True)
    protocol_version = models.CharField(max_length=16, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    # The desired-state generation: raised (compare-and-set) whenever the content of the node's desired
    # state changes, whoever changed the rows behind it (a cycle, a cancel, node loss, a drain).
    generation = models.PositiveBigIntegerField(default=0)
    desired_digest = models.CharField(max_length=64, blank=True)  # SHA-256 of the content last served
    generation_applied = models.PositiveBigIntegerField(default=0)  # what the agent last said it applied
    stored_seq = models.PositiveBigIntegerField(default=0)  # highest report seq stored
    # The agent's pace as the plane receives it (docs/fleet.md, "Node health"): the agent's own clock at
    # its latest heartbeat (`sent_at_s`), the gap between its last two heartbeats on that clock, the
    # lowest receive-minus-send difference seen (clock offset plus the quickest delivery), and how much
    # later than that the latest heartbeat arrived (the plane's intake delay, in seconds).
    last_sent_s = models.FloatField(null=True, blank=True)
    heartbeat_gap_s = models.FloatField(null=True, blank=True)
    clock_offset_s = models.FloatField(null=True, blank=True)
    heartbeat_lag_s = models.FloatField(default=0.0)
    # When telemetry was last stored for this node (kept at most once per WHALEGEN_TELEMETRY_SAMPLE_S):
    # read with the row a heartbeat reads anyway, instead of the newest of the node's GPU samples.
    telemetry_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"agent of node {self.node_id}"


class FleetIngestion(models.Model):
    """One row: whether the plane itself hears its agents. Written only by the node-health check.

    When no node at all has heartbeated for a while, the likelier story is that the plane's own intake is
    down (web tier stopped, a proxy gone), not that every node died at once: the check then declares no
    node lost (`deaf_since`), and once heartbeats arrive again every node gets a full loss threshold
    counted from `resumed_at` before its silence can count against it.
    """

    deaf_since = models.DateTimeField(null=True, blank=True)  # the last heartbeat heard before the gap
    resumed_at = models.DateTimeField(null=True, blank=True)  # when the check first heard again
    checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"fleet ingestion (deaf since {self.deaf_since})" if self.deaf_since else "fleet ingestion"


class AgentReport(models.Model):
    """A report as received; (node, seq) is unique, which is what makes a resent report a no-op."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agent_reports")
    seq = models.PositiveBigIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)
    payload = models.JSONField()

    class Meta:
        ordering = ["node_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["node", "seq"], name="agent_report_node_seq_unique")]

    def __str__(self) -> str:
        return f"report {self.seq} of node {self.node_id}"


class TaskRun(models.Model):
    """What a node's agent last said about one attempt of a task it was given (agent states).

    The agent knows a run by (task id, attempt) — protocol 1.1's `attempt` field, or a 1.0 agent's
    `<task>.<n>` id — so a requeued task handed to the same node again is a new run there, never
    confused with the old process it may still be stopping.

        The plane's own task state lives on `Task`; this row is how the desired state knows a task whose
        assignment was released (cancelled, preempted, requeued after loss) may still have a process on the
        node, so it lists it as `stop` until the agent reports it ended.
    """

    class State(models.TextChoices):
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        STOPPED = "stopped", "stopped"
        LOST = "lost", "lost"
        REJECTED = "rejected", "rejected"

    ALIVE = frozenset({State.STARTING, State.RUNNING})

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="task_runs")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="runs")
    attempt = models.PositiveIntegerField(default=0)  # Task.attempts when this run was handed out
    state = models.CharField(max_length=10, choices=State.choices)
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    device_uuid = models.CharField(max_length=80, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    # When a heartbeat (protocol 1.1) first failed to list this alive run; cleared when listed again.
    missing_since = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_id", "task_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "task", "attempt"], name="task_run_node_task_attempt_unique"
            )
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} attempt {self.attempt} on node {self.node_id}: {self.state}"


class GpuPartition(models.Model):
    """The last partition report for a GPU: what the agent found and did for a desired generation.

    ComputeUnits stay the plane's plan; this is the node's answer to it, which a cycle reads before
    binding a task to a freshly planned MIG instance (`gpu_partition_applied`).
    """

    gpu = models.OneToOneField(Gpu, on_delete=models.CASCADE, primary_key=True, related_name="partition")
    state = models.CharField(max_length=24)  # whalegen.protocol.PartitionState
    generation = models.PositiveBigIntegerField()
    instances = models.JSONField(default=list, blank=True)
    errors = models.JSONField(default=list, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    reported_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"GPU {self.gpu_id}: {self.state} @ {self.generation}"


class GpuEvent(models.Model):
    """An NVML event from a heartbeat (Xid, ECC, MIG change) or a GPU the agent says is lost."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=24)
    xid = models.IntegerField(null=True, blank=True)
    fatal = models.BooleanField(default=False)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} on GPU {self.gpu_id} at {self.at}"


class GpuSample(models.Model):
    """One telemetry sample of a GPU, as the agent measured it (None where NVML does not offer it)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(db_index=True)
    mem_used_mib = models.IntegerField(null=True, blank=True)
    mem_total_mib = models.IntegerField(null=True, blank=True)
    util_gpu_pct = models.SmallIntegerField(null=True, blank=True)
    util_mem_pct = models.SmallIntegerField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    temperature_c = models.SmallIntegerField(null=True, blank=True)
    sm_clock_mhz = models.IntegerField(null=True, blank=True)
    ecc_uncorrected_aggregate = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.at}"


class TaskSample(models.Model):
    """GPU memory a task's process used at one instant: the raw material of its profile."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="samples")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="task_samples")
    at = models.DateTimeField(db_index=True)
    pid = models.IntegerField()
    used_mib = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"task {self.task_id} at {self.at}: {self.used_mib} MiB"


class JoinToken(models.Model):
    """A secret an admin hands to GPU hosts so that each can make itself a node of one pool, once
    (`whalegen agent join`): the host trades it for its own node credential.

    Only the hash is kept; the secret is shown once, when made. `uses` is raised by a conditional UPDATE
    that must touch one row (`apps.fleet.join.node_join`), so a single-use token joins one node however
    many hosts present it at the same moment.
    """

    name = models.SlugField(max_length=64, unique=True)
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="join_tokens")
    # A node belongs to a cluster as well as a pool; the token says which, so the host needs to know
    # only the pool (what the operator asked for).
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="join_tokens")
    token_hash = models.CharField(max_length=64, unique=True)  # SHA-256 of the secret
    prefix = models.CharField(max_length=16)  # the secret's first characters: to tell tokens apart
    created_at = models.DateTimeField()
    created_by = models.CharField(max_length=150, blank=True)  # an actor: "user:root", "cli:ops"
    expires_at = models.DateTimeField()
    max_uses = models.PositiveIntegerField(null=True, blank=True)  # None: unlimited until expiry
    uses = models.PositiveIntegerField(default=0)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)
    # The token's, not the pool's: a pool whose nodes all need approval is one whose admins make only
    # approval tokens. Kept here so inventory's tables stay inventory's.
    requires_approval = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_uses__isnull=True) | models.Q(max_uses__gte=1),
                name="join_token_max_uses_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(max_uses__isnull=True) | models.Q(uses__lte=models.F("max_uses")),
                name="join_token_uses_within_max",
            ),
        ]

    def __str__(self) -> str:
        return f"join token {self.name} ({self.prefix}…) for pool {self.pool_id}"


class NodeJoin(models.Model):
    """How a node joined: by which token, from which host, and whether an admin has approved it.

    A node waiting for approval is cordoned (the scheduler gives it nothing) and cannot be uncordoned
    until approved; its agent registers and heartbeats meanwhile, so the admin sees a live node.
    """

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="joined")
    join_token = models.ForeignKey(
        JoinToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="joins"
    )
    joined_at = models.DateTimeField()
    hostname = models.CharField(max_length=255, blank=True)
    approval_required = models.BooleanField(default=False)
    approved_at = models.DateTimeField(null=True, blank=True)
    approved_by = models.CharField(max_length=150, blank=True)

    def __str__(self) -> str:
        return f"node {self.node_id} joined {self.joined_at}"

    @property
    def pending_approval(self) -> bool:
        return self.approval_required and self.approved_at is None
