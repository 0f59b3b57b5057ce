"""What `whalegen apply` keeps of its own: where each applied object came from, and GPU prices.

The objects themselves (pools, tenants, queues, …) live in their own apps and are written only through
those apps' services; this app never adds a column to them. `AppliedObject` is the kubectl
"last-applied" record: it marks an object as owned by a file, which is what `--prune` may delete.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from apps.inventory.models import gpu_model_choices


class AppliedObject(models.Model):
    """One object applied from a document: its kind, its key (`h100-train`, `vision/train`,
    `eu-west-1/eu-h100-01`), the document it came from, who applied it and the hash of its spec."""

    kind = models.CharField(max_length=32)
    key = models.CharField(max_length=300)
    source = models.CharField(max_length=500, blank=True)  # "fleet.yaml#3": file and document number
    # "user:root", as task events name actors: a string, not a user foreign key, so that deleting the user
    # later leaves the record readable.
    applied_by = models.CharField(max_length=150)
    applied_at = models.DateTimeField()
    spec_hash = models.CharField(max_length=64)  # SHA-256 of the normalised document

    class Meta:
        ordering = ["kind", "key"]
        constraints = [models.UniqueConstraint(fields=["kind", "key"], name="applied_object_kind_key_unique")]

    def __str__(self) -> str:
        return f"{self.kind}/{self.key} from {self.source or '?'}"


class GpuPrice(models.Model):
    """Price of one GPU-hour of a catalogue model, in WHALEGEN_CURRENCY.

    Until this table, prices came only from WHALEGEN_GPU_PRICES; they still do, and a row here wins for
    its model (apps.accounting.selectors.gpu_prices). It lives in this app, not in accounting, because
    `apply` is its only writer and no other app may gain a migration while this one is built (issue #38).
    """

    model = models.CharField(max_length=32, unique=True, choices=gpu_model_choices)
    per_gpu_hour = models.FloatField(validators=[MinValueValidator(0.0)])
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["model"]

    def __str__(self) -> str:
        return f"{self.model}: {self.per_gpu_hour:g}/GPU-h"
