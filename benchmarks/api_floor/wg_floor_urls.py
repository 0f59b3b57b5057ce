"""The floor endpoints (see wg_floor_wsgi), then every URL of the measured checkout."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


def django_trivial(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


class DrfTokenOnly(APIView):
    """The project's default authentication and permission classes, and its renderer; no query."""

    def get(self, request: Request) -> Response:
        return Response({"ok": True, "user": request.user.pk})


urlpatterns = [
    path("api/v1/floor/django/", django_trivial),
    path("api/v1/floor/drf/", DrfTokenOnly.as_view()),
    path("", include("whalegen.config.urls")),
]
