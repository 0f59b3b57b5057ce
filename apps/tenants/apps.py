from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    default_auto_field = "django.db.models.BigAutoField"
