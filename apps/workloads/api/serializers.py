"""Input and output shapes for the workloads API. Field rules here; domain rules live in services."""

from __future__ import annotations

from rest_framework import serializers

from apps.forecasting.api.serializers import TaskForecastOutputSerializer
from apps.workloads.models import Queue, Quota, Task, TaskEvent


class TaskInputSerializer(serializers.Serializer):
    tenant = serializers.SlugField(required=False, help_text="Tenant slug; defaults to the token's tenant.")
    queue = serializers.SlugField()
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    gpu_count = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    gpu_milli = serializers.IntegerField(
        min_value=1, max_value=1000, default=1000, help_text="Share of each GPU in thousandths; 1000 = whole."
    )
    gpu_mem_mib = serializers.IntegerField(min_value=1, required=False, allow_null=True, help_text="Per GPU.")
    cpu_milli = serializers.IntegerField(min_value=0, default=1000)
    host_mem_mib = serializers.IntegerField(min_value=0, default=4096)
    allowed_gpu_models = serializers.ListField(child=serializers.CharField(max_length=32), required=False)
    isolation = serializers.ChoiceField(choices=Task.Isolation.choices, default=Task.Isolation.ANY)
    kind = serializers.ChoiceField(choices=Task.Kind.choices, default=Task.Kind.BATCH)
    sla_class = serializers.ChoiceField(choices=Task.SlaClass.choices, default=Task.SlaClass.BATCH)
    priority = serializers.IntegerField(required=False, allow_null=True, help_text="Defaults to the queue's.")
    preemptible = serializers.BooleanField(default=True)
    gang_id = serializers.CharField(max_length=100, required=False, allow_blank=True)
    gang_size = serializers.IntegerField(min_value=1, max_value=4096, default=1)
    command = serializers.ListField(child=serializers.CharField(), required=False, help_text="argv")
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    max_runtime_s = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    profile_key = serializers.CharField(max_length=200, required=False, allow_blank=True)


class BulkTaskItemSerializer(TaskInputSerializer):
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_blank=False)


class BulkSubmitInputSerializer(serializers.Serializer):
    tenant = serializers.SlugField(required=False)
    tasks = BulkTaskItemSerializer(many=True, allow_empty=False, max_length=1000)


class TaskOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    queue = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    submitted_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    forecast = TaskForecastOutputSerializer(
        read_only=True, allow_null=True, help_text="Predictions made at submission; null until made."
    )

    class Meta:
        model = Task
        fields = [
            "id", "tenant", "queue", "pool", "submitted_by", "name", "state", "version",
            "gpu_count", "gpu_milli", "gpu_mem_mib", "cpu_milli", "host_mem_mib", "allowed_gpu_models",
            "isolation", "kind", "sla_class", "priority", "preemptible", "gang_id", "gang_size",
            "command", "env", "max_runtime_s", "profile_key", "idempotency_key",
            "attempts", "why_pending", "why_pending_code", "exit_code",
            "created_at", "updated_at", "started_at", "finished_at",
            "predicted_duration_p50_s", "predicted_duration_p90_s", "predicted_gpu_mem_peak_mib",
            "predicted_start_at", "forecast",
        ]  # fmt: skip
        read_only_fields = fields


class TaskCancelInputSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=400, required=False, allow_blank=True)


class TaskEventOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = TaskEvent
        fields = ["id", "created_at", "from_state", "to_state", "actor", "reason"]
        read_only_fields = fields


class QueueInputSerializer(serializers.Serializer):
    tenant = serializers.SlugField(required=False)
    pool = serializers.SlugField()
    name = serializers.SlugField(max_length=64)
    default_priority = serializers.IntegerField(default=0, min_value=-1000, max_value=1000)
    weight = serializers.IntegerField(default=1, min_value=1, max_value=1000)


class QueueUpdateInputSerializer(serializers.Serializer):
    name = serializers.SlugField(max_length=64, required=False)
    default_priority = serializers.IntegerField(required=False, min_value=-1000, max_value=1000)
    weight = serializers.IntegerField(required=False, min_value=1, max_value=1000)


class QueueOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Queue
        fields = ["id", "tenant", "pool", "name", "default_priority", "weight", "created_at", "updated_at"]
        read_only_fields = fields


class QuotaInputSerializer(serializers.Serializer):
    tenant = serializers.SlugField()
    pool = serializers.SlugField()
    guaranteed_milli = serializers.IntegerField(min_value=0)
    borrow_limit_milli = serializers.IntegerField(min_value=0, default=0)
    gpu_mem_limit_mib = serializers.IntegerField(min_value=1, required=False, allow_null=True)


class QuotaUpdateInputSerializer(serializers.Serializer):
    guaranteed_milli = serializers.IntegerField(min_value=0, required=False)
    borrow_limit_milli = serializers.IntegerField(min_value=0, required=False)
    gpu_mem_limit_mib = serializers.IntegerField(min_value=1, required=False, allow_null=True)


class QuotaOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    limit_milli = serializers.IntegerField(read_only=True)
    tasks_pending = serializers.IntegerField(read_only=True, help_text="Live tasks still waiting.")
    tasks_live = serializers.IntegerField(read_only=True, help_text="Tasks holding a charge (not finished).")

    class Meta:
        model = Quota
        fields = [
            "id", "tenant", "pool", "guaranteed_milli", "borrow_limit_milli", "limit_milli",
            "gpu_mem_limit_mib",
            "charged_milli", "charged_mem_mib", "tasks_pending", "tasks_live", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields
