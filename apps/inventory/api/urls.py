from django.urls import path

from apps.inventory.api import views

urlpatterns = [
    path("pools/", views.PoolListApi.as_view(), name="pools"),
    path("pools/<int:pool_id>/", views.PoolDetailApi.as_view(), name="pool-detail"),
    path("clusters/", views.ClusterListApi.as_view(), name="clusters"),
    path("clusters/<int:cluster_id>/", views.ClusterDetailApi.as_view(), name="cluster-detail"),
    path("nodes/", views.NodeListApi.as_view(), name="nodes"),
    path("nodes/<int:node_id>/", views.NodeDetailApi.as_view(), name="node-detail"),
    path("gpus/", views.GpuListApi.as_view(), name="gpus"),
    path("gpus/<int:gpu_id>/", views.GpuDetailApi.as_view(), name="gpu-detail"),
]
