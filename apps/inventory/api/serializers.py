from __future__ import annotations

from rest_framework import serializers

from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool


class PoolOutputSerializer(serializers.ModelSerializer):
    node_count = serializers.IntegerField(read_only=True)
    allowed_image_prefixes = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Image references a task may name must start with one of these; empty = any image.",
    )
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Pool
        fields = [
            "id", "name", "description", "runtime", "allowed_image_prefixes", "image_pull_policy",
            "node_count", "gpu_count", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class ClusterOutputSerializer(serializers.ModelSerializer):
    node_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Cluster
        fields = ["id", "name", "region", "node_count", "created_at"]
        read_only_fields = fields


class NodeOutputSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = [
            "id", "cluster", "pool", "name", "cpu_milli", "mem_mib", "labels", "state", "last_heartbeat_at",
            "agent_version", "gpu_count",
        ]  # fmt: skip
        read_only_fields = fields


class ComputeUnitOutputSerializer(serializers.ModelSerializer):
    in_use = serializers.SerializerMethodField(help_text="Whether a task holds this unit, whoever's it is.")
    task = serializers.SerializerMethodField(
        help_text="The id of the task holding the unit when you may see that task; null when the unit is "
        "free or holds another tenant's task (then only `in_use` says it is taken)."
    )

    class Meta:
        model = ComputeUnit
        fields = [
            "id", "kind", "mig_profile", "mig_start", "mps_thread_pct", "gpu_milli", "mem_mib", "in_use",
            "task",
        ]  # fmt: skip
        read_only_fields = fields

    # `holder_id` and `holder_tenant_id` are annotations of `gpu_list` (a unit stores no holder).
    def get_in_use(self, unit: ComputeUnit) -> bool:
        return unit.holder_id is not None  # type: ignore[attr-defined]

    def get_task(self, unit: ComputeUnit) -> int | None:
        holder: int | None = unit.holder_id  # type: ignore[attr-defined]
        if holder is None:
            return None
        access = self.context.get("access")
        tenant_id = unit.holder_tenant_id  # type: ignore[attr-defined]
        # Without the caller's access (no request), show nothing rather than another tenant's id.
        if access is None or tenant_id is None or not access.can_see(tenant_id):
            return None
        return holder


class GpuOutputSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)
    pool = serializers.CharField(source="node.pool.name", read_only=True)
    units = ComputeUnitOutputSerializer(many=True, read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id", "uuid", "cluster", "pool", "node", "index", "model", "mem_mib", "mig_capable",
            "partition_mode", "health", "units",
        ]  # fmt: skip
        read_only_fields = fields
