from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0003_agent_pace_and_fleet_ingestion"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodeagent",
            name="telemetry_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
