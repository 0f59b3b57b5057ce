"""Writes of GPU prices, the one row `whalegen apply` keeps itself (apps.declarative.models.GpuPrice): what
a GPU-hour of a catalogue model costs. Accounting reads them through the `gpu_prices_applied` hook.

A module of its own, not services.py: services.py imports `kinds`, which calls these.
"""

from __future__ import annotations

from apps.common.models import save_validated
from apps.declarative.models import GpuPrice


def gpu_price_set(*, model: str, per_gpu_hour: float, actor: str) -> GpuPrice:
    price = GpuPrice.objects.filter(model=model).first() or GpuPrice(model=model)
    return save_validated(price, {"per_gpu_hour": per_gpu_hour, "updated_by": actor[:150]})


def gpu_price_delete(*, price: GpuPrice) -> None:
    price.delete()
