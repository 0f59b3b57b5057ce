"""The browser dashboard, mounted at the site root."""

from django.contrib.auth import views as auth_views
from django.urls import path

from apps.dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="registration/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tasks/", views.task_list, name="task-list"),
    path("tasks/<int:task_id>/", views.task_detail, name="task-detail"),
    path("tasks/<int:task_id>/cancel/", views.task_cancel, name="task-cancel"),
    path("overrides/", views.overrides, name="overrides"),
    path("overrides/<int:override_id>/approve/", views.override_approve, name="override-approve"),
    path("overrides/<int:override_id>/reject/", views.override_reject, name="override-reject"),
    path("pools/", views.pool_list, name="pool-list"),
    path("pools/<int:pool_id>/", views.pool_detail, name="pool-detail"),
    path("pools/<int:pool_id>/history/", views.pool_history_page, name="pool-history"),
    path("pools/<int:pool_id>/whatif/", views.pool_whatif_page, name="pool-whatif"),
    path("accounting/", views.accounting, name="accounting"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]
