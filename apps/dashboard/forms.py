"""Dashboard forms: they parse what a browser posts; the services decide what is allowed."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from apps.tenants.models import Membership, Tenant
from apps.tenants.services import TOKEN_MAX_TTL_DAYS
from apps.workloads.models import Queue, Task


class TaskFilterForm(forms.Form):
    state = forms.ChoiceField(choices=[("", "any state"), *Task.State.choices], required=False)
    queue = forms.ModelChoiceField(
        queryset=Queue.objects.none(),
        required=False,
        empty_label="any queue",
        error_messages={"invalid_choice": "unknown queue"},
    )

    def __init__(self, *args: Any, queues: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = queues  # type: ignore[attr-defined]
        self.fields["queue"].label_from_instance = lambda q: f"{q.tenant.slug}/{q.name}"  # type: ignore[attr-defined]


class CancelForm(forms.Form):
    reason = forms.CharField(max_length=500, required=False)


class OverrideRequestForm(forms.Form):
    """A raise for one task (by id) or one queue (from the caller's queues)."""

    task = forms.IntegerField(min_value=1, required=False, label="task id")
    queue = forms.ModelChoiceField(
        queryset=Queue.objects.none(),
        required=False,
        label="or a queue",
        empty_label="—",
        error_messages={"invalid_choice": "unknown queue"},
    )
    wanted_priority = forms.IntegerField(label="wanted priority")
    reason = forms.CharField(max_length=500, label="reason", widget=forms.Textarea(attrs={"rows": 2}))
    ttl_hours = forms.IntegerField(
        required=False,
        label="lifetime (hours)",
        widget=forms.NumberInput(attrs={"placeholder": "empty: the default"}),
    )

    def __init__(self, *args: Any, queues: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = queues  # type: ignore[attr-defined]
        self.fields["queue"].label_from_instance = lambda q: f"{q.tenant.slug}/{q.name}"  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if (data.get("task") is None) == (data.get("queue") is None) and not self.has_error("queue"):
            raise ValidationError("name exactly one target: a task id or a queue")
        return data

    def add_service_errors(self, error: ValidationError) -> None:
        """Put a service's field errors on the matching fields, the rest above the form."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for field, messages in error.message_dict.items():
            self.add_error(field if field in self.fields else None, messages)


class DecisionForm(forms.Form):
    comment = forms.CharField(max_length=500, required=False)


class TokenCreateForm(forms.Form):
    """A token of the caller's own; the service keeps its role at or below theirs."""

    name = forms.CharField(max_length=100, label="name", widget=forms.TextInput(attrs={"placeholder": "ci"}))
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.none(),
        to_field_name="slug",
        label="tenant",
        empty_label=None,
        error_messages={"invalid_choice": "unknown tenant"},
    )
    role = forms.ChoiceField(
        choices=[("", "my role there"), *Membership.Role.choices], required=False, label="role"
    )
    ttl_days = forms.IntegerField(
        min_value=1,
        max_value=TOKEN_MAX_TTL_DAYS,
        required=False,
        label="lifetime (days)",
        widget=forms.NumberInput(attrs={"placeholder": "empty: the default (90)"}),
    )

    def __init__(self, *args: Any, tenants: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants  # type: ignore[attr-defined]
        self.fields["tenant"].label_from_instance = lambda t: t.slug  # type: ignore[attr-defined]

    def add_service_errors(self, error: ValidationError) -> None:
        """Put a service's field errors on the matching fields, the rest above the form."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for field, messages in error.message_dict.items():
            self.add_error(field if field in self.fields else None, messages)
