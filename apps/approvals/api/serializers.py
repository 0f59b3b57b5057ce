from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.approvals.models import OverrideAuditEntry, PriorityOverride, ReclaimRequest
from apps.common.fields import INT64_MAX, StrictCharField, StrictInputSerializer, StrictIntegerField


class OverrideRequestInputSerializer(StrictInputSerializer):
    task = StrictIntegerField(
        min_value=1, max_value=INT64_MAX, required=False, help_text="Task id; name a task or a queue."
    )
    queue = StrictIntegerField(
        min_value=1, max_value=INT64_MAX, required=False, help_text="Queue id; name a task or a queue."
    )
    wanted_priority = StrictIntegerField(min_value=-1000, max_value=1000)
    reason = StrictCharField(max_length=500)
    ttl_hours = StrictIntegerField(min_value=1, max_value=24 * 30, required=False)

    def validate(self, attrs: dict) -> dict:
        if ("task" in attrs) == ("queue" in attrs):
            raise serializers.ValidationError({"task": ["name exactly one target: a task or a queue"]})
        return attrs


class OverrideDecisionInputSerializer(StrictInputSerializer):
    comment = StrictCharField(max_length=500, required=False, allow_blank=True)


class OverrideAuditOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = OverrideAuditEntry
        fields = ["created_at", "action", "actor", "note"]
        read_only_fields = fields


class OverrideOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    requested_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Null once the user is deleted."
    )
    decided_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Null until decided."
    )

    class Meta:
        model = PriorityOverride
        fields = [
            "id", "tenant", "task", "queue", "wanted_priority", "previous_priority", "reason", "requested_by",
            "state", "decided_by", "decided_at", "comment", "expires_at", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class TaskWaitOutputSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="The why-pending code, e.g. quota_exceeded.")
    why = serializers.CharField(help_text="The task's why-pending sentence, as the task shows it.")


class OverrideDetailOutputSerializer(OverrideOutputSerializer):
    audit = OverrideAuditOutputSerializer(many=True, read_only=True)
    task_waits = serializers.SerializerMethodField(
        help_text="While the target task is pending: why it waits, in the task's own words. A raise orders "
        "a tenant's work and can preempt lower priorities; it does not lift a quota (quota_exceeded) or "
        "make a task fit a node it is larger than."
    )

    class Meta(OverrideOutputSerializer.Meta):
        fields = [*OverrideOutputSerializer.Meta.fields, "audit", "task_waits"]
        read_only_fields = fields

    @extend_schema_field(TaskWaitOutputSerializer(allow_null=True))
    def get_task_waits(self, override: PriorityOverride) -> dict[str, str] | None:
        task = override.task
        if task is None or task.state != task.State.PENDING:
            return None
        return {"code": task.why_pending_code, "why": task.why_pending}


class ReclaimDecisionInputSerializer(StrictInputSerializer):
    comment = StrictCharField(max_length=500, required=False, allow_blank=True)


class ReclaimOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(source="task.tenant", slug_field="slug", read_only=True)
    decided_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Null until decided."
    )

    class Meta:
        model = ReclaimRequest
        fields = [
            "id", "tenant", "task", "attempt", "reason", "state", "decided_by", "decided_at", "comment",
            "created_at",
        ]  # fmt: skip
        read_only_fields = fields
