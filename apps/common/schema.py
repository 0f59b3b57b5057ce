"""The OpenAPI generator: drf-spectacular's, plus the error answers of every operation in the one shape
`apps.common.exceptions` produces, so the committed document lists what a client can really get."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every refusal other than bad input: what went wrong, in a sentence.",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
VALIDATION_ERROR_SCHEMA = {
    "type": "object",
    "description": (
        "Bad input (400). `detail` names the refused fields; each further key is a field of the request "
        "(or `non_field_errors`) with its messages: a list of strings, or for a list or object field an "
        "object keyed by index or key. In a bulk submission `tasks` is a list that lines up with the "
        "submitted one, `{}` for each task that was fine. `code`, where present, names a kind of refusal a "
        "client should tell apart from a typo: `cannot_run_here` (the request could never run in that pool)."
    ),
    "properties": {
        "detail": {"type": "string"},
        "code": {"type": "string", "enum": ["cannot_run_here"]},
    },
    "required": ["detail"],
    "additionalProperties": {"oneOf": [{"type": "array"}, {"type": "object"}]},
}

_DESCRIPTIONS = {
    "400": "Bad input; nothing was changed.",
    "401": "No token, or a token that is unknown, revoked or expired.",
    "403": "You can see this, but your role does not allow the action.",
    "404": "Not there, or not yours to see.",
    "409": "The state forbids it now (a final task, a reused idempotency key, a queue with tasks).",
    "413": "The body is above the upload limit.",
    "415": "The body is not JSON (send `Content-Type: application/json`).",
}


class WhaleGenAutoSchema(AutoSchema):
    def _error_response(self, code: str) -> dict[str, Any]:
        name, schema = (
            ("ValidationError", VALIDATION_ERROR_SCHEMA) if code == "400" else ("Error", ERROR_SCHEMA)
        )
        component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema)
        self.registry.register_on_missing(component)
        return {
            "description": _DESCRIPTIONS[code],
            "content": {"application/json": {"schema": component.ref}},
        }

    def _error_codes(self) -> list[str]:
        codes = ["401", "403"]
        has_body = self.method in {"POST", "PUT", "PATCH"}
        # Query parameters declared on the operation (`extend_schema(parameters=…)`) are validated too.
        if has_body or self.get_filter_backends() or self._is_list_view() or self.get_override_parameters():
            codes.append("400")
        if "{" in self.path:
            codes.append("404")
        if has_body or self.method == "DELETE":
            codes.append("409")
        if has_body:
            codes.extend(["413", "415"])
        return sorted(codes)

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        if direction == "response":
            for code in self._error_codes():
                responses.setdefault(code, self._error_response(code))
        return responses
