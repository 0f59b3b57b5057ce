from django.urls import path

from apps.approvals.api import views

urlpatterns = [
    path("overrides/", views.OverrideListRequestApi.as_view(), name="overrides"),
    path("overrides/<int:override_id>/", views.OverrideDetailApi.as_view(), name="override-detail"),
    path("overrides/<int:override_id>/approve/", views.OverrideApproveApi.as_view(), name="override-approve"),
    path("overrides/<int:override_id>/reject/", views.OverrideRejectApi.as_view(), name="override-reject"),
]
urlpatterns += [
    path("reclaims/", views.ReclaimListApi.as_view(), name="reclaims"),
    path("reclaims/<int:reclaim_id>/", views.ReclaimDetailApi.as_view(), name="reclaim-detail"),
    path("reclaims/<int:reclaim_id>/approve/", views.ReclaimApproveApi.as_view(), name="reclaim-approve"),
    path("reclaims/<int:reclaim_id>/reject/", views.ReclaimRejectApi.as_view(), name="reclaim-reject"),
]
