"""Dashboard forms: they parse what a browser posts; the services decide what is allowed."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

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
