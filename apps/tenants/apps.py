from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the bearer scheme with drf-spectacular (extensions register on import).
        from apps.tenants import schema  # noqa: F401
