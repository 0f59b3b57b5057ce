"""Input and output shapes for the workloads API. Field rules here; domain rules live in services."""

from __future__ import annotations

from rest_framework import serializers

from apps.common.fields import (
    INT64_MAX,
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictSlugField,
)
from apps.workloads.models import Queue, Quota, Task, TaskEvent


class TaskInputSerializer(StrictInputSerializer):
    # Ranges are the columns' (PostgreSQL int2 / int4 / int8): anything outside is a 400 here, never a
    # DataError at INSERT.
    tenant = StrictSlugField(required=False, help_text="Tenant slug; defaults to the token's tenant.")
    queue = StrictSlugField()
    name = StrictCharField(max_length=200, required=False, allow_blank=True)
    gpu_count = StrictIntegerField(min_value=1, max_value=1024, default=1)
    gpu_milli = StrictIntegerField(
        min_value=1, max_value=1000, default=1000, help_text="Share of each GPU in thousandths; 1000 = whole."
    )
    gpu_mem_mib = StrictIntegerField(min_value=1, required=False, allow_null=True, help_text="Per GPU.")
    cpu_milli = StrictIntegerField(min_value=0, default=1000)
    host_mem_mib = StrictIntegerField(min_value=0, max_value=INT64_MAX, default=4096)
    allowed_gpu_models = serializers.ListField(
        child=StrictCharField(max_length=32), required=False, max_length=64
    )
    isolation = StrictChoiceField(choices=Task.Isolation.choices, default=Task.Isolation.ANY)
    kind = StrictChoiceField(choices=Task.Kind.choices, default=Task.Kind.BATCH)
    sla_class = StrictChoiceField(choices=Task.SlaClass.choices, default=Task.SlaClass.BATCH)
    priority = StrictIntegerField(required=False, allow_null=True, help_text="Defaults to the queue's.")
    preemptible = StrictBooleanField(default=True)
    gang_id = StrictCharField(max_length=100, required=False, allow_blank=True)
    gang_size = StrictIntegerField(min_value=1, max_value=4096, default=1)
    # A task needs something to run: an empty argv used to be accepted, launched, and lost on every
    # attempt (the launcher refuses it). argv[0] is the executable, so it cannot be blank either.
    command = serializers.ListField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False),
        allow_empty=False,
        help_text="argv: the executable, then its arguments (not a shell string).",
    )
    env = serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False),
        required=False,
        help_text="Environment of the run. Values may be secrets: they go only to the node that runs the "
        "task and are never shown again (reads give `env_keys`).",
    )
    image = StrictCharField(
        max_length=512,
        required=False,
        allow_blank=True,
        help_text="OCI image reference ([registry/]name[:tag][@digest]) the task runs in; `command` is the "
        "argv inside it. Default: the queue's default image. Required in a `container` pool (unless the "
        "queue has a default), refused in a `process` pool.",
    )
    max_runtime_s = StrictIntegerField(min_value=1, required=False, allow_null=True)
    working_dir = StrictCharField(
        max_length=1024,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Absolute directory on the GPU host the command starts in; default: the run's own "
        "directory on the agent. One that cannot be entered fails the run (exit code 126).",
    )
    profile_key = StrictCharField(max_length=200, required=False, allow_blank=True)

    def validate_working_dir(self, value: str) -> str:
        if value and not value.startswith("/"):
            raise serializers.ValidationError("must be an absolute path on the GPU host (starting with /)")
        return value

    def validate_command(self, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise serializers.ValidationError("the first item is the executable; it cannot be blank")
        return value


class BulkTaskItemSerializer(TaskInputSerializer):
    # The batch has one tenant (the body's `tenant`); a per-task tenant would be refused as unknown.
    tenant = None  # type: ignore[assignment]
    idempotency_key = StrictCharField(max_length=200, required=False, allow_blank=False)


class BulkSubmitInputSerializer(StrictInputSerializer):
    tenant = StrictSlugField(required=False)
    tasks = BulkTaskItemSerializer(many=True, allow_empty=False, max_length=1000)


class TaskForecastOutputSerializer(serializers.ModelSerializer):
    """A task's forecast and where it came from: `source` is `model` (with `model_version`),
    `baseline` (with `baseline` = key_history | global_median and `history_count`) or `none`.
    `mem_bound_mib`: while the task runs, the memory-peak model's bound on its next hour (per GPU)."""

    class Meta:
        # TaskForecast is forecasting's, above this app (apps.LAYERS); its one-to-one relation to Task
        # (`task.forecast`) names it, so workloads need not import forecasting.
        model = Task._meta.get_field("forecast").related_model
        fields = [
            "duration_p50_s", "duration_p90_s", "gpu_mem_peak_mib", "source", "model_version", "baseline",
            "history_count", "mem_source", "mem_bound_mib", "mem_bound_at", "mem_bound_model_version",
            "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class TaskOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    queue = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    submitted_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Null once the user is deleted."
    )
    forecast = TaskForecastOutputSerializer(
        read_only=True, allow_null=True, help_text="Predictions made at submission; null until made."
    )
    # The scheduler's latest word on a pending task (its TaskWait row; blank or null once it moved on).
    why_pending = serializers.CharField(read_only=True)
    why_pending_code = serializers.CharField(read_only=True)
    predicted_start_at = serializers.DateTimeField(read_only=True, allow_null=True)
    # Keys only: the values may be secrets (docs/api.md, "Secrets in env").
    env_keys = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="Names of the task's env variables."
    )

    class Meta:
        model = Task
        fields = [
            "id", "tenant", "queue", "pool", "submitted_by", "name", "state", "version",
            "gpu_count", "gpu_milli", "gpu_mem_mib", "cpu_milli", "host_mem_mib", "allowed_gpu_models",
            "isolation", "kind", "sla_class", "priority", "preemptible", "gang_id", "gang_size",
            "runtime", "image", "command", "env_keys", "max_runtime_s", "working_dir", "profile_key",
            "idempotency_key",
            "attempts", "why_pending", "why_pending_code", "exit_code", "failure_reason", "idle_flagged_at",
            "created_at", "updated_at", "started_at", "finished_at",
            "predicted_duration_p50_s", "predicted_duration_p90_s", "predicted_gpu_mem_peak_mib",
            "predicted_start_at", "forecast",
        ]  # fmt: skip
        read_only_fields = fields


class TaskCancelInputSerializer(StrictInputSerializer):
    reason = StrictCharField(max_length=200, required=False, allow_blank=True)


class TaskEventOutputSerializer(serializers.ModelSerializer):
    # Blank on the first event (submission: from nowhere); the enum says so.
    from_state = serializers.ChoiceField(
        choices=[("", "none (submitted)"), *Task.State.choices], read_only=True
    )

    class Meta:
        model = TaskEvent
        fields = ["id", "created_at", "from_state", "to_state", "actor", "reason"]
        read_only_fields = fields


class QueueInputSerializer(StrictInputSerializer):
    tenant = StrictSlugField(required=False)
    pool = StrictSlugField()
    name = StrictSlugField(max_length=64)
    default_priority = StrictIntegerField(default=0, min_value=-1000, max_value=1000)
    weight = StrictIntegerField(default=1, min_value=1, max_value=1000)
    idle_reclaim = StrictChoiceField(choices=Queue.IdleReclaim.choices, default=Queue.IdleReclaim.NOTIFY)
    default_image = StrictCharField(
        max_length=512,
        required=False,
        allow_blank=True,
        default="",
        help_text="OCI image a task of this queue runs when it names none (container pools).",
    )


class QueueUpdateInputSerializer(StrictInputSerializer):
    name = StrictSlugField(max_length=64, required=False)
    default_priority = StrictIntegerField(required=False, min_value=-1000, max_value=1000)
    weight = StrictIntegerField(required=False, min_value=1, max_value=1000)
    idle_reclaim = StrictChoiceField(choices=Queue.IdleReclaim.choices, required=False)
    default_image = StrictCharField(max_length=512, required=False, allow_blank=True)


class QueueOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Queue
        fields = [
            "id", "tenant", "pool", "name", "default_priority", "weight", "idle_reclaim", "default_image",
            "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields


class QuotaInputSerializer(StrictInputSerializer):
    tenant = StrictSlugField()
    pool = StrictSlugField()
    guaranteed_milli = StrictIntegerField(min_value=0)
    borrow_limit_milli = StrictIntegerField(min_value=0, default=0)
    gpu_mem_limit_mib = StrictIntegerField(min_value=1, max_value=INT64_MAX, required=False, allow_null=True)


class QuotaUpdateInputSerializer(StrictInputSerializer):
    guaranteed_milli = StrictIntegerField(min_value=0, required=False)
    borrow_limit_milli = StrictIntegerField(min_value=0, required=False)
    gpu_mem_limit_mib = StrictIntegerField(min_value=1, max_value=INT64_MAX, required=False, allow_null=True)


class QuotaOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    limit_milli = serializers.IntegerField(read_only=True)
    held_milli = serializers.IntegerField(
        read_only=True,
        help_text="What the tenant's admitted, assigned and running tasks hold (what the limit counts).",
    )
    held_mem_mib = serializers.IntegerField(read_only=True, help_text="GPU memory those tasks state, MiB.")
    waiting_milli = serializers.IntegerField(
        read_only=True, help_text="What the tenant's pending tasks ask; a pending task holds no quota."
    )
    tasks_pending = serializers.IntegerField(read_only=True, help_text="Tasks waiting (holding nothing).")
    tasks_admitted = serializers.IntegerField(read_only=True, help_text="Tasks holding quota.")

    class Meta:
        model = Quota
        fields = [
            "id", "tenant", "pool", "guaranteed_milli", "borrow_limit_milli", "limit_milli",
            "gpu_mem_limit_mib",
            "held_milli", "held_mem_mib", "waiting_milli", "tasks_pending", "tasks_admitted", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields
