"""The fleet: clusters, pools, nodes, GPUs and the compute units carved out of them."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.common.models import TimestampedModel
from whalegen.gpus import model_names


def gpu_model_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in model_names()]


class Cluster(TimestampedModel):
    """A site or region; each of its nodes runs one agent."""

    name = models.SlugField(max_length=64, unique=True)
    region = models.CharField(max_length=64, blank=True)
    # Cordoned as a whole: its nodes keep what they run but the scheduler places nothing new there.
    # A flag on the cluster, not a state copied onto each node, so a node that returns or joins later
    # does not slip out of the cordon.
    cordoned = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Pool(TimestampedModel):
    """GPUs offered to tenants under one name. Nodes of several clusters may join the same pool."""

    class Runtime(models.TextChoices):
        """How the pool's GPU hosts run a task (whalegen.protocol.TaskRuntime; docs/isolation.md)."""

        CONTAINER = "container", "container: an OCI image through the host's container engine"
        PROCESS = "process", "process: a command of the host, as the tenant's uid in a sandbox"

    class PullPolicy(models.TextChoices):
        ALWAYS = "always", "always pull"
        MISSING = "missing", "pull when the host lacks the image"
        NEVER = "never", "never pull (the image must be on the host)"

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)
    # Operator settings (platform admins, through the admin). New pools run containers; pools that
    # existed before runtimes did were migrated to `process`, what their hosts were already doing
    # (migration 0009), so an upgrade changes nothing that runs.
    runtime = models.CharField(max_length=10, choices=Runtime.choices, default=Runtime.CONTAINER)
    # Image references a task of this pool may name must start with one of these (e.g.
    # "registry.example.org/ml/"); empty = any image.
    allowed_image_prefixes = models.JSONField(default=list, blank=True)
    image_pull_policy = models.CharField(max_length=8, choices=PullPolicy.choices, default=PullPolicy.MISSING)
    # Every host joining this pool waits cordoned for a platform admin's approval, whatever its join
    # token says (a token can ask for approval in any pool; this makes a pool ask for it always).
    join_requires_approval = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        prefixes = self.allowed_image_prefixes
        if not isinstance(prefixes, list) or not all(isinstance(x, str) and x.strip() for x in prefixes):
            raise ValidationError(
                {"allowed_image_prefixes": ["a list of image reference prefixes (non-blank strings)"]}
            )


class Node(TimestampedModel):
    class State(models.TextChoices):
        READY = "ready", "ready"
        CORDONED = "cordoned", "cordoned"  # runs what it has, takes nothing new
        DRAINING = "draining", "draining"  # its tasks are being moved off
        LOST = "lost", "lost"  # no heartbeat within the deadline

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="nodes")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="nodes")
    name = models.CharField(max_length=128)
    cpu_milli = models.PositiveIntegerField()
    mem_mib = models.PositiveBigIntegerField()
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.READY, db_index=True)
    # While lost: the state it was lost from, so that an operator's cordon or drain outlives the silence.
    state_before_lost = models.CharField(max_length=10, choices=State.choices, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # SHA-256 of the agent's credential, like API tokens: the agent holds the secret, we hold the hash.
    # Indexed: every agent request authenticates by looking this hash up.
    agent_credential_hash = models.CharField(max_length=64, blank=True, db_index=True)
    agent_version = models.CharField(max_length=32, blank=True)
    # Raised on every write that changes what can be placed here; cycles compare-and-set on it. Not
    # indexed, and the table keeps half of each page free (migration 0007), so raising it is a HOT update.
    version = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_cluster_name_unique")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.name}"


class Gpu(TimestampedModel):
    class PartitionMode(models.TextChoices):
        WHOLE = "whole", "whole GPU"
        MIG = "mig", "MIG instances"
        MPS = "mps", "MPS shares"
        TIME_SLICE = "timeslice", "time slices"

    class Health(models.TextChoices):
        HEALTHY = "healthy", "healthy"
        DEGRADED = "degraded", "degraded"  # e.g. correctable ECC errors climbing
        UNHEALTHY = "unhealthy", "unhealthy"  # XID / uncorrectable errors; take nothing new

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()  # NVML device index on its node
    uuid = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=32, choices=gpu_model_choices)
    mem_mib = models.PositiveIntegerField()
    mig_capable = models.BooleanField(default=False)
    partition_mode = models.CharField(
        max_length=10, choices=PartitionMode.choices, default=PartitionMode.WHOLE
    )
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.HEALTHY)

    class Meta:
        ordering = ["node_id", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_node_index_unique")]

    def __str__(self) -> str:
        return f"{self.model} {self.uuid}"


class ComputeUnit(TimestampedModel):
    """What a task is given: a whole GPU, a MIG instance, an MPS share or a time slice."""

    class Kind(models.TextChoices):
        WHOLE = "whole", "whole GPU"
        MIG = "mig", "MIG instance"
        MPS = "mps", "MPS share"
        TIME_SLICE = "timeslice", "time slice"

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="units")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    # MIG: the profile name (e.g. "3g.40gb") and its start memory slice (the placement).
    mig_profile = models.CharField(max_length=16, blank=True)
    mig_start = models.PositiveSmallIntegerField(null=True, blank=True)
    # MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; time slice: none, the memory bound is the watchdog's.
    mps_thread_pct = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    gpu_milli = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(1000)])
    mem_mib = models.PositiveIntegerField()
    # No holder column: the task holding a unit is the one whose live assignment lists it
    # (`apps.scheduling.holders`). A unit row is written when its GPU is carved and never again while it
    # exists, so binding tens of thousands of units costs the cycle no UPDATE of them
    # (docs/notes/cycle-speed.md, "Speed round 8").

    class Meta:
        ordering = ["gpu_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(kind="mig")
                | (models.Q(mig_start__isnull=False) & ~models.Q(mig_profile="")),
                name="unit_mig_has_profile_and_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.mig_profile or self.gpu_milli} on {self.gpu_id}"
