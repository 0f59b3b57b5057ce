from django.apps import AppConfig


class WorkloadsConfig(AppConfig):
    name = "apps.workloads"
    default_auto_field = "django.db.models.BigAutoField"
