from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "apps.fleet"
    default_auto_field = "django.db.models.BigAutoField"
