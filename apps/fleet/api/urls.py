"""Agent endpoints at the protocol's paths (`whalegen.protocol`, under /api/v1/agent/) and node actions."""

from django.urls import path

from apps.fleet.api import join, views
from whalegen import protocol as p

PREFIX = "/api/v1/"


def _route(full_path: str) -> str:
    assert full_path.startswith(PREFIX)
    return full_path.removeprefix(PREFIX)


urlpatterns = [
    path(_route(p.REGISTER_PATH), views.RegisterApi.as_view(), name="agent-register"),
    path(_route(p.HEARTBEAT_PATH), views.heartbeat_view, name="agent-heartbeat"),
    path(_route(p.DESIRED_STATE_PATH), views.DesiredStateApi.as_view(), name="agent-desired-state"),
    path(_route(p.REPORT_PATH), views.ReportApi.as_view(), name="agent-reports"),
    path(_route(p.JOIN_PATH), join.JoinApi.as_view(), name="agent-join"),
    path("join-tokens/", join.JoinTokenListCreateApi.as_view(), name="join-tokens"),
    path("join-tokens/<int:token_id>/revoke/", join.JoinTokenRevokeApi.as_view(), name="join-token-revoke"),
    path("nodes/<int:node_id>/approve/", join.NodeApproveApi.as_view(), name="node-approve"),
    path("nodes/<int:node_id>/cordon/", views.NodeCordonApi.as_view(), name="node-cordon"),
    path("nodes/<int:node_id>/uncordon/", views.NodeUncordonApi.as_view(), name="node-uncordon"),
    path("nodes/<int:node_id>/drain/", views.NodeDrainApi.as_view(), name="node-drain"),
]
