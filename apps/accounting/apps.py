from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "apps.accounting"
    default_auto_field = "django.db.models.BigAutoField"
