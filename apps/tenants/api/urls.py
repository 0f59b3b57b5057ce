from django.urls import path

from apps.tenants.api import views

urlpatterns = [
    path("tenants/", views.TenantListApi.as_view(), name="tenants"),
]
