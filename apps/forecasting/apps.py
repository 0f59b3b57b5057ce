from django.apps import AppConfig


class ForecastingConfig(AppConfig):
    name = "apps.forecasting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.common import hooks
        from apps.forecasting.services import tasks_forecast_attach_on_commit

        hooks.tasks_submitted.register(tasks_forecast_attach_on_commit)
