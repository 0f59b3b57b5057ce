"""Query filters for the list endpoints (django-filter), used by the selectors."""

from __future__ import annotations

import django_filters

from apps.common.filters import UtcIsoDateTimeFilter
from apps.workloads.models import Queue, Quota, Task


class TaskFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=Task.State.choices)
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    queue = django_filters.CharFilter(field_name="queue__name")
    pool = django_filters.CharFilter(field_name="pool__name")
    kind = django_filters.ChoiceFilter(choices=Task.Kind.choices)
    sla_class = django_filters.ChoiceFilter(choices=Task.SlaClass.choices)
    isolation = django_filters.ChoiceFilter(choices=Task.Isolation.choices)
    gang_id = django_filters.CharFilter()
    profile_key = django_filters.CharFilter()
    idempotency_key = django_filters.CharFilter()
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Task
        fields: list[str] = []


class QueueFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    pool = django_filters.CharFilter(field_name="pool__name")
    name = django_filters.CharFilter()

    class Meta:
        model = Queue
        fields: list[str] = []


class QuotaFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    pool = django_filters.CharFilter(field_name="pool__name")

    class Meta:
        model = Quota
        fields: list[str] = []
