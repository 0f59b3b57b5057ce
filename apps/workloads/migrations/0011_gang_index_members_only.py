"""The gang index holds gang members only: a task that is in no gang (most) has no entry, so the cycle's
task moves, none of them heap-only (`state` is indexed), write one index entry fewer each."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("workloads", "0010_unindexed_submitter_and_event_time")]

    operations = [
        migrations.RemoveIndex(model_name="task", name="task_gang_id_idx"),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(condition=~models.Q(gang_id=""), fields=["gang_id"], name="task_gang_id_idx"),
        ),
    ]
