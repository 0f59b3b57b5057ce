from typing import Any

from django.db import models


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


def save_validated(obj: models.Model, values: dict[str, Any]) -> Any:
    """Set `values` on `obj`, validate it with the model's `full_clean` and save it."""
    for key, value in values.items():
        setattr(obj, key, value)
    obj.full_clean()
    obj.save()
    return obj
