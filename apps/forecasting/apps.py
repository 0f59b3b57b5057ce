from django.apps import AppConfig


class ForecastingConfig(AppConfig):
    name = "apps.forecasting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.common import hooks
        from apps.forecasting.selectors import pool_shape_forecast, pool_shape_mix
        from apps.forecasting.services import tasks_forecast_attach_on_commit

        hooks.tasks_submitted.register(tasks_forecast_attach_on_commit)
        hooks.pool_shape_mix.register(pool_shape_mix)
        hooks.pool_shape_forecast.register(pool_shape_forecast)
