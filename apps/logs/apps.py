from django.apps import AppConfig


class LogsConfig(AppConfig):
    name = "apps.logs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.common import hooks
        from apps.logs.services import log_chunks_check, log_chunks_store

        hooks.agent_logs_check.register(log_chunks_check)
        hooks.agent_logs_store.register(log_chunks_store)
