from django.urls import path

from apps.forecasting.api import views

urlpatterns = [
    path("forecast-models/", views.ForecastModelListApi.as_view(), name="forecast-models"),
    path("profiles/", views.TaskProfileListApi.as_view(), name="profiles"),
]
