"""Output shapes of the forecasting API (all read-only)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.forecasting.models import ForecastModel
from apps.workloads.models import TaskProfile
from whalegen.forecast.profiles import MemoryPattern, right_size


class ForecastModelOutputSerializer(serializers.ModelSerializer):
    # Null for a plane-wide model.
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = ForecastModel
        fields = [
            "id", "kind", "pool", "tenant", "version", "state", "metrics", "train_start", "train_end",
            "validation_start", "validation_end", "trained_at", "promoted_at", "retired_at",
            "decision_reason",
        ]  # fmt: skip
        read_only_fields = fields


class ForecastModelAdminOutputSerializer(ForecastModelOutputSerializer):
    """Platform admins also see the envelope's size (the bytes stay in the database and the admin)."""

    blob_size_bytes = serializers.IntegerField(read_only=True)

    class Meta(ForecastModelOutputSerializer.Meta):
        fields = [*ForecastModelOutputSerializer.Meta.fields, "blob_size_bytes"]
        read_only_fields = fields


class RightSizingSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    unit = serializers.CharField(help_text="mig | mps | whole | too_big")
    need_mib = serializers.IntegerField(help_text="Observed peak × (1 + margin).")
    mig_profile = serializers.CharField(allow_null=True)
    mps_mem_limit_mib = serializers.IntegerField(allow_null=True)
    mps_thread_pct = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()


class TaskProfileOutputSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    right_sizing = serializers.SerializerMethodField(
        help_text="Smallest unit of each GPU model in the tenant's pools that would have held the observed "
        "peak with the margin; empty until the profile has a memory peak."
    )

    class Meta:
        model = TaskProfile
        fields = [
            "id", "tenant", "profile_key", "sample_count", "duration_p50_s", "duration_p90_s",
            "gpu_mem_peak_mib", "gpu_mem_typical_mib", "gpu_mem_p95_mib", "gpu_util_mean", "gpu_util_p95",
            "gpu_util_burstiness", "mem_growth", "sla_class", "telemetry_samples", "telemetry_tasks",
            "last_sample_at", "updated_at", "right_sizing",
        ]  # fmt: skip
        read_only_fields = fields

    @staticmethod
    def _pattern(value: str) -> MemoryPattern:
        try:
            return MemoryPattern(value)
        except ValueError:
            return MemoryPattern.UNKNOWN

    @extend_schema_field(RightSizingSerializer(many=True))
    def get_right_sizing(self, profile: TaskProfile) -> list[dict[str, object]]:
        if profile.gpu_mem_peak_mib is None:
            return []
        models = self.context.get("gpu_models", {}).get(profile.tenant_id, [])
        out = []
        for gpu_model in models:
            advice = right_size(
                float(profile.gpu_mem_peak_mib),
                gpu_model,
                margin=settings.WHALEGEN_RIGHT_SIZE_MARGIN,
                # The P95 duty cycle of the GPUs the key ran on (whole-GPU NVML figure): a MIG profile
                # must also offer that share of compute. Without telemetry, sizing is by memory only.
                util_p95_pct=None if profile.gpu_util_p95 is None else profile.gpu_util_p95 * 100.0,
                pattern=self._pattern(profile.mem_growth),
            )
            out.append(
                {
                    "gpu_model": gpu_model,
                    "unit": str(advice.kind),
                    "need_mib": advice.need_mib,
                    "mig_profile": advice.mig_profile,
                    "mps_mem_limit_mib": advice.mps_mem_limit_mib,
                    "mps_thread_pct": advice.mps_thread_pct,
                    "reason": advice.reason,
                }
            )
        return RightSizingSerializer(out, many=True).data
