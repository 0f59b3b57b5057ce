from django.apps import AppConfig


class DeclarativeConfig(AppConfig):
    name = "apps.declarative"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "declarative objects (whalegen apply)"

    def ready(self) -> None:
        from apps.common import hooks
        from apps.declarative.selectors import gpu_prices_applied

        hooks.gpu_prices_applied.register(gpu_prices_applied)
