import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0002_runtimes"),
    ]

    operations = [
        # Tokens made before roles existed get `admin`: a token acts with the lower of its role and its
        # owner's present role, so they keep doing exactly what they did (their owner's role).
        migrations.AddField(
            model_name="apitoken",
            name="role",
            field=models.CharField(
                choices=[("viewer", "viewer"), ("member", "member"), ("admin", "admin")],
                default="admin",
                max_length=8,
            ),
            preserve_default=False,
        ),
        migrations.CreateModel(
            name="TokenAudit",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                (
                    "action",
                    models.CharField(choices=[("created", "created"), ("revoked", "revoked")], max_length=8),
                ),
                ("token_prefix", models.CharField(max_length=16)),
                ("token_name", models.CharField(max_length=100)),
                ("tenant", models.CharField(max_length=64)),
                ("owner", models.CharField(max_length=150)),
                (
                    "role",
                    models.CharField(
                        choices=[("viewer", "viewer"), ("member", "member"), ("admin", "admin")], max_length=8
                    ),
                ),
                ("actor", models.CharField(max_length=150)),
                (
                    "via",
                    models.CharField(
                        choices=[
                            ("api", "API"),
                            ("dashboard", "dashboard"),
                            ("operator", "operator on the plane"),
                            ("admin", "Django admin"),
                        ],
                        max_length=10,
                    ),
                ),
                ("via_token_prefix", models.CharField(blank=True, max_length=16)),
                (
                    "token",
                    models.ForeignKey(
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="audit",
                        to="tenants.apitoken",
                    ),
                ),
            ],
            options={
                "ordering": ["created_at", "id"],
            },
        ),
    ]
