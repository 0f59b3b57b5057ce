from django.urls import path

from apps.declarative.api import views

urlpatterns = [
    path("apply/", views.ApplyApi.as_view(), name="apply"),
    path("objects/<str:kind>/", views.DocumentListApi.as_view(), name="objects"),
    path("objects/<str:kind>/<path:name>/", views.DocumentDetailApi.as_view(), name="object-detail"),
    path("members/", views.MemberListApi.as_view(), name="members"),
    path("prices/", views.PriceListApi.as_view(), name="prices"),
]
