from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "apps.inventory"
    default_auto_field = "django.db.models.BigAutoField"
