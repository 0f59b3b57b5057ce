from django.urls import path

from apps.workloads.api import views

urlpatterns = [
    path("tasks/", views.TaskListSubmitApi.as_view(), name="tasks"),
    path("tasks/bulk/", views.TaskBulkSubmitApi.as_view(), name="tasks-bulk"),
    path("tasks/<int:task_id>/", views.TaskDetailApi.as_view(), name="task-detail"),
    path("tasks/<int:task_id>/cancel/", views.TaskCancelApi.as_view(), name="task-cancel"),
    path("tasks/<int:task_id>/events/", views.TaskEventListApi.as_view(), name="task-events"),
    path("queues/", views.QueueListCreateApi.as_view(), name="queues"),
    path("queues/<int:queue_id>/", views.QueueDetailApi.as_view(), name="queue-detail"),
    path("quotas/", views.QuotaListCreateApi.as_view(), name="quotas"),
    path("quotas/<int:quota_id>/", views.QuotaDetailApi.as_view(), name="quota-detail"),
]
