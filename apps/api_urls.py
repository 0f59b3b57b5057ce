"""API v1: every app's routes under /api/v1/."""

from django.urls import include, path

from apps.common.views import ApiIndexApi

urlpatterns = [
    path("", ApiIndexApi.as_view(), name="api-index"),
    path("", include("apps.tenants.api.urls")),
    path("", include("apps.inventory.api.urls")),
    path("", include("apps.workloads.api.urls")),
    path("", include("apps.approvals.api.urls")),
    path("", include("apps.forecasting.api.urls")),
    path("", include("apps.fleet.api.urls")),
    path("", include("apps.logs.api.urls")),
    path("", include("apps.accounting.api.urls")),
    path("", include("apps.declarative.api.urls")),
]
