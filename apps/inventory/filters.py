"""Query filters for the inventory list endpoints."""

from __future__ import annotations

import django_filters

from apps.inventory.models import Gpu, Node


class NodeFilter(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name")
    pool = django_filters.CharFilter(field_name="pool__name")
    state = django_filters.MultipleChoiceFilter(choices=Node.State.choices)

    class Meta:
        model = Node
        fields: list[str] = []


class GpuFilter(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="node__cluster__name")
    pool = django_filters.CharFilter(field_name="node__pool__name")
    node = django_filters.NumberFilter(field_name="node_id")
    model = django_filters.CharFilter()
    health = django_filters.ChoiceFilter(choices=Gpu.Health.choices)
    partition_mode = django_filters.ChoiceFilter(choices=Gpu.PartitionMode.choices)
    mig_capable = django_filters.BooleanFilter()

    class Meta:
        model = Gpu
        fields: list[str] = []
