from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "apps.metrics"
    default_auto_field = "django.db.models.BigAutoField"
