"""The Celery app. Workers: `celery -A whalegen.config worker`; beat: `celery -A whalegen.config beat`."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")

app = Celery("whalegen")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
