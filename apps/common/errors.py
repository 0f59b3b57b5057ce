"""Errors services raise. The API's exception handler turns each into one HTTP answer.

Services validate with `django.core.exceptions.ValidationError` keyed by field (a 400 with field-level
messages). The two below cover what is not bad input: an action not allowed for this caller (403) and
a state that changed under the caller's feet or forbids the action (409).
"""

from __future__ import annotations


class ApplicationError(Exception):
    """A domain rule refused the action; `status` is the HTTP status the API answers with."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotAllowed(ApplicationError):
    status = 403


class Conflict(ApplicationError):
    status = 409
