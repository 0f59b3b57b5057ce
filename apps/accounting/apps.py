from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "apps.accounting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.accounting.selectors import budgets_spent
        from apps.accounting.services import held_units_keep
        from apps.common import hooks

        hooks.gpu_units_deleting.register(held_units_keep)
        hooks.budgets_spent.register(budgets_spent)
