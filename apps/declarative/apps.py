from django.apps import AppConfig


class DeclarativeConfig(AppConfig):
    name = "apps.declarative"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "declarative objects (whalegen apply)"
