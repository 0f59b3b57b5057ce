from django.urls import path

from apps.tenants.api import views

urlpatterns = [
    path("tenants/", views.TenantListApi.as_view(), name="tenants"),
    path("tokens/", views.TokenListCreateApi.as_view(), name="tokens"),
    path("tokens/<int:token_id>/", views.TokenDetailApi.as_view(), name="token-detail"),
    path("tokens/<int:token_id>/revoke/", views.TokenRevokeApi.as_view(), name="token-revoke"),
]
