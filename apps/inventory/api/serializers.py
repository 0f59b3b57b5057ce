from __future__ import annotations

from rest_framework import serializers

from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool


class PoolOutputSerializer(serializers.ModelSerializer):
    node_count = serializers.IntegerField(read_only=True)
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Pool
        fields = ["id", "name", "description", "node_count", "gpu_count", "created_at"]
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
    class Meta:
        model = ComputeUnit
        fields = ["id", "kind", "mig_profile", "mig_start", "mps_thread_pct", "gpu_milli", "mem_mib", "task"]
        read_only_fields = fields


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
