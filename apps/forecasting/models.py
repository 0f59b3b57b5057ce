"""The model registry (versioned forecasters with their metrics and windows) and per-task forecasts."""

from __future__ import annotations

from django.db import models

from apps.inventory.models import Pool
from apps.tenants.models import Tenant
from apps.workloads.models import Task


class ForecastModel(models.Model):
    """One trained forecaster envelope (`whalegen.forecast` `to_bytes()`), as a candidate or in service.

    Scope: `pool` and `tenant` both empty is a plane-wide model (the duration model learns pools and
    tenants as features); a pool-scoped model serves one pool. At most one model is active per
    kind and scope (a partial unique constraint on `scope`).
    """

    class Kind(models.TextChoices):
        DURATION = "duration", "duration at submission (P50/P90)"
        MEMORY_PEAK = "memory_peak", "GPU memory peak (upper quantile)"
        ARRIVALS = "arrivals", "arrivals per task shape"
        IDLE_GPUS = "idle_gpus", "idle GPUs per pool"

    class State(models.TextChoices):
        CANDIDATE = "candidate", "candidate"
        ACTIVE = "active", "active"
        RETIRED = "retired", "retired"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # "" (plane-wide), "pool:<id>" or "tenant:<id>": the scope as one non-null key, so the uniqueness
    # rules below hold on PostgreSQL and on the embedded SQLite alike (NULLs never compare equal).
    scope = models.CharField(max_length=64, blank=True, editable=False)
    version = models.PositiveIntegerField()  # 1, 2, … per kind and scope
    state = models.CharField(max_length=10, choices=State.choices, default=State.CANDIDATE, db_index=True)
    blob = models.BinaryField()  # the envelope exactly as `to_bytes()` wrote it (UTF-8 JSON)
    # {"metric": "log_mae", "models": {"xgboost_p50": {…}, "global_median": {…}, …},
    #  "active_same_inputs": {…}|null, "n_train": …, "n_validation": …}
    metrics = models.JSONField(default=dict)
    train_start = models.DateTimeField()
    train_end = models.DateTimeField()  # = the validation split: training rows finished before it
    validation_start = models.DateTimeField()
    validation_end = models.DateTimeField()
    trained_at = models.DateTimeField()
    promoted_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["kind", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "scope", "version"], name="forecastmodel_scope_version_unique"
            ),
            models.UniqueConstraint(
                fields=["kind", "scope"],
                condition=models.Q(state="active"),
                name="forecastmodel_one_active_per_scope",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} v{self.version} ({self.state})"

    @staticmethod
    def scope_of(pool: Pool | None, tenant: Tenant | None) -> str:
        if pool is not None and tenant is not None:
            return f"pool:{pool.pk}/tenant:{tenant.pk}"
        if pool is not None:
            return f"pool:{pool.pk}"
        return f"tenant:{tenant.pk}" if tenant is not None else ""


class TaskForecast(models.Model):
    """What was predicted for one task at submission, and from what.

    `source` says where the numbers come from: an active model (its version is kept), an honest
    baseline (the key's history, else the plane's median) when no model is active, or nothing at all
    when there is no history yet (the numbers are then empty, never invented).
    """

    class Source(models.TextChoices):
        MODEL = "model", "active model"
        BASELINE = "baseline", "baseline"
        NONE = "none", "no history"

    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="forecast")
    duration_p50_s = models.FloatField(null=True, blank=True)
    duration_p90_s = models.FloatField(null=True, blank=True)
    gpu_mem_peak_mib = models.PositiveIntegerField(null=True, blank=True)
    source = models.CharField(max_length=8, choices=Source.choices)
    model = models.ForeignKey(
        ForecastModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="task_forecasts"
    )
    model_version = models.PositiveIntegerField(null=True, blank=True)  # kept if the model row goes
    # "key_history" (quantiles of this tenant + profile key's finished runs), "global_median", "".
    baseline = models.CharField(max_length=32, blank=True)
    history_count = models.PositiveIntegerField(default=0)  # finished runs behind a baseline
    mem_source = models.CharField(max_length=32, blank=True)  # "profile_peak" or ""
    # While the task runs: the active memory-peak model's bound on its GPU memory over the next hour
    # (per GPU, MiB), refreshed by `memory_bounds_refresh`, with when and by which version.
    mem_bound_mib = models.PositiveIntegerField(null=True, blank=True)
    mem_bound_at = models.DateTimeField(null=True, blank=True)
    mem_bound_model_version = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"forecast of task {self.task_id} ({self.source})"
