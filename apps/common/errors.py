"""Errors services raise. The API's exception handler turns each into one HTTP answer.

Services validate with `django.core.exceptions.ValidationError` keyed by field (a 400 with field-level
messages). The two below cover what is not bad input: an action not allowed for this caller (403) and
a state that changed under the caller's feet or forbids the action (409).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError


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


class CodedValidationError(ValidationError):
    """Bad input of a kind a client should tell apart from a typo: the API's 400 carries `api_code` beside
    the field errors (`apps.common.exceptions`). The apps subclass it, so this package names none of them."""

    api_code = ""


class BulkItemError(ApplicationError):
    """One item of a bulk submission was refused; nothing of the batch was stored. The API answers 400
    with the refusal at the item's index in a list as long as the batch."""

    def __init__(self, *, index: int, count: int, error: ValidationError) -> None:
        super().__init__(f"task {index} of {count} was refused")
        self.index = index
        self.count = count
        self.error = error
