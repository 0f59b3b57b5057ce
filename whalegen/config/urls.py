from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

# The dashboard's pages inline their icon; Django's admin and the Swagger UI do not, so browsers ask for
# /favicon.ico there and log a 404 in the console. The same circle, served here, cached for a day.
FAVICON_SVG = (
    b"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'>"
    b"<circle cx='8' cy='8' r='7' fill='#17324d'/></svg>"
)


def favicon(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(FAVICON_SVG, content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response


urlpatterns = [
    path("favicon.ico", favicon),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/v1/", include("apps.api_urls")),
    path("", include("apps.metrics.urls")),
    path("", include("apps.dashboard.urls")),
]
