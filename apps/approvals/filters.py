"""Query filters for the overrides list."""

from __future__ import annotations

import django_filters

from apps.approvals.models import PriorityOverride


class OverrideFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=PriorityOverride.State.choices)
    tenant = django_filters.CharFilter(field_name="tenant__slug")

    class Meta:
        model = PriorityOverride
        fields: list[str] = []
