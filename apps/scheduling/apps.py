from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.common import hooks
        from apps.scheduling.holders import with_holders

        hooks.units_with_holders.register(with_holders)
