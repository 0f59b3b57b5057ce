from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.common.fields import StrictBooleanField, StrictInputSerializer
from apps.tenants.models import Membership


@extend_schema_field(
    {
        "type": "object",
        "description": "A document: apiVersion (whalegen/v1), kind, metadata, spec; status is ignored.",
        "additionalProperties": True,
        "example": {"kind": "Pool", "metadata": {"name": "h100-train"}, "spec": {"runtime": "process"}},
    }
)
class DocumentField(serializers.JSONField):
    """Any JSON object: documents are checked by `apply` itself, so that each message can name the
    document, path and field (`fleet.yaml#3 spec.guaranteed_gpus: …`)."""


class ApplyInputSerializer(StrictInputSerializer):
    documents = serializers.ListField(child=DocumentField(), allow_empty=True, max_length=5000)
    sources = serializers.ListField(
        child=serializers.CharField(max_length=500, allow_blank=True),
        required=False,
        default=list,
        help_text="Where each document came from, in the same order (`fleet.yaml#3`): named in every "
        "message and recorded as the object's source. Default: `document#N`.",
    )
    dry_run = StrictBooleanField(
        required=False, default=False, help_text="Show the difference; store nothing."
    )
    prune = StrictBooleanField(
        required=False,
        default=False,
        help_text="Also delete objects an earlier apply made, of the kinds given, that no document names now "
        "(refused, with the reason, while in use).",
    )


class ApplyResultSerializer(serializers.Serializer):
    kind = serializers.CharField()
    key = serializers.CharField(
        help_text="The object's name: `h100-train`, `vision/train`, `eu-west-1/eu-h100-01`."
    )
    outcome = serializers.ChoiceField(choices=["created", "configured", "unchanged", "pruned", "refused"])
    source = serializers.CharField()
    diff = serializers.DictField(
        child=serializers.ListField(), help_text='Field path → [old, new], e.g. {"spec.weight": [1, 2]}.'
    )
    reason = serializers.CharField(help_text="Why it was refused; blank otherwise.")
    notes = serializers.ListField(child=serializers.CharField())


class ApplyOutputSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    results = ApplyResultSerializer(many=True)


class DocumentListSerializer(serializers.Serializer):
    kind = serializers.CharField()
    items = serializers.ListField(child=DocumentField())


class MemberOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "tenant", "user", "role", "created_at"]
        read_only_fields = fields


class PriceOutputSerializer(serializers.Serializer):
    model = serializers.CharField()
    per_gpu_hour = serializers.FloatField()
    currency = serializers.CharField()
    source = serializers.ChoiceField(
        choices=["applied", "environment"],
        help_text="applied: a GpuPrice object; environment: WHALEGEN_GPU_PRICES (an applied price wins).",
    )
