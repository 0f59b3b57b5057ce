"""Tell drf-spectacular how bearer tokens travel, so the OpenAPI document and Swagger UI show it."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.tenants.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant-scoped token (dashboard, API tokens; or `whalegen token create`): "
            "`Authorization: Bearer wg_…`",
        }
