"""Django wiring only. Importing this package loads the Celery app so `@shared_task` binds to it."""

from whalegen.config.celery import app as celery_app

__all__ = ["celery_app"]
