from django.apps import AppConfig


class PeriodicConfig(AppConfig):
    name = "apps.periodic"
    default_auto_field = "django.db.models.BigAutoField"
