"""Pool runtimes (issue 37). Pools that exist already are set to `process`: their hosts ran tasks as host
processes and their tasks name no image, so an upgrade must not turn them into container pools that
refuse every submission. A pool created afterwards defaults to `container` (the field's new default)."""

from django.db import migrations, models

RUNTIME_CHOICES = [
    ("container", "container: an OCI image through the host's container engine"),
    ("process", "process: a command of the host, as the tenant's uid in a sandbox"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0008_unit_holder_from_assignments"),
    ]

    operations = [
        migrations.AddField(
            model_name="pool",
            name="allowed_image_prefixes",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="pool",
            name="image_pull_policy",
            field=models.CharField(
                choices=[
                    ("always", "always pull"),
                    ("missing", "pull when the host lacks the image"),
                    ("never", "never pull (the image must be on the host)"),
                ],
                default="missing",
                max_length=8,
            ),
        ),
        # Existing rows take `process` from the column default of the AddField; then the default becomes
        # `container` for pools created from now on.
        migrations.AddField(
            model_name="pool",
            name="runtime",
            field=models.CharField(choices=RUNTIME_CHOICES, default="process", max_length=10),
        ),
        migrations.AlterField(
            model_name="pool",
            name="runtime",
            field=models.CharField(choices=RUNTIME_CHOICES, default="container", max_length=10),
        ),
    ]
