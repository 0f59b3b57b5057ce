from django.apps import AppConfig


class ForecastingConfig(AppConfig):
    name = "apps.forecasting"
    default_auto_field = "django.db.models.BigAutoField"
