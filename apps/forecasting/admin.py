from django.contrib import admin

from apps.forecasting.models import ForecastModel, TaskForecast


@admin.register(ForecastModel)
class ForecastModelAdmin(admin.ModelAdmin):
    """Models are trained and promoted by the training task (every decision needs its metrics); the
    admin shows the registry and never edits it."""

    list_display = ["id", "kind", "pool", "tenant", "version", "state", "trained_at", "promoted_at"]
    list_filter = ["kind", "state"]
    exclude = ["blob"]
    readonly_fields = [f.name for f in ForecastModel._meta.fields if f.name != "blob"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(TaskForecast)
class TaskForecastAdmin(admin.ModelAdmin):
    list_display = ["task", "source", "model_version", "baseline", "duration_p50_s", "duration_p90_s"]
    list_filter = ["source", "baseline"]
    readonly_fields = [f.name for f in TaskForecast._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
