from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        # Registers the bearer scheme with drf-spectacular (extensions register on import).
        from apps.tenants import schema  # noqa: F401
        from apps.tenants.models import ApiToken, Membership, Tenant

        # Any write to what a caller's access is made of forgets this process's remembered callers
        # (apps.tenants.callers): a change here is seen here at once, elsewhere within the cache's TTL.
        for model in (ApiToken, Membership, Tenant, get_user_model()):
            name = model.__name__
            post_save.connect(_forget_callers, sender=model, dispatch_uid=f"forget-callers-save-{name}")
            post_delete.connect(_forget_callers, sender=model, dispatch_uid=f"forget-callers-delete-{name}")


def _forget_callers(**_: object) -> None:
    from apps.tenants.callers import forget_callers

    forget_callers()
