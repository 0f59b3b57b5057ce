"""`Task.working_dir` (where the command starts on the host) and `Task.failure_reason` (why a failed task
failed), the latter filled for tasks that failed before it existed from the event that failed them."""

from typing import Any

from django.db import migrations, models
from django.db.models import OuterRef, Subquery, Value
from django.db.models.functions import Coalesce


def fill_failure_reasons(apps: Any, schema_editor: Any) -> None:
    Task = apps.get_model("workloads", "Task")
    TaskEvent = apps.get_model("workloads", "TaskEvent")
    last_failure = TaskEvent.objects.filter(task_id=OuterRef("pk"), to_state="failed").order_by("-pk")
    reason = Coalesce(Subquery(last_failure.values("reason")[:1]), Value(""))
    Task.objects.filter(state="failed").update(failure_reason=reason)


class Migration(migrations.Migration):
    dependencies = [
        ("workloads", "0004_task_not_before_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="failure_reason",
            field=models.CharField(blank=True, max_length=500),
        ),
        migrations.AddField(
            model_name="task",
            name="working_dir",
            field=models.CharField(blank=True, max_length=1024),
        ),
        migrations.RunPython(fill_failure_reasons, migrations.RunPython.noop),
    ]
