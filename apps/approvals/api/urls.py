from django.urls import path

from apps.approvals.api import views

urlpatterns = [
    path("overrides/", views.OverrideListRequestApi.as_view(), name="overrides"),
    path("overrides/<int:override_id>/", views.OverrideDetailApi.as_view(), name="override-detail"),
    path("overrides/<int:override_id>/approve/", views.OverrideApproveApi.as_view(), name="override-approve"),
    path("overrides/<int:override_id>/reject/", views.OverrideRejectApi.as_view(), name="override-reject"),
]
