from django.urls import path

from apps.logs.api import views

urlpatterns = [
    path("tasks/<int:task_id>/logs/", views.TaskLogsApi.as_view(), name="task-logs"),
]
