"""The one error the fleet model raises: it names the host, the role and the field to fix."""

from __future__ import annotations


class FleetError(ValueError):
    """An inventory that cannot work, with where it goes wrong: host, role and field, and for a
    refused value the value as it may be shown (masked when secret), what is allowed and the
    closest valid name."""

    def __init__(self, host: str, role: str | None, field: str, message: str, *,
                 value: str | None = None, allowed: str | None = None,
                 suggestion: str | None = None) -> None:
        self.host = host
        self.role = role
        self.field = field
        self.reason = message
        self.value = value
        self.allowed = allowed
        self.suggestion = suggestion
        where = f"host {host}" + (f", role {role}" if role else "") + f", field {field}"
        text = f"{where}: {message}"
        if value is not None:
            text += f": {value}"
        if allowed:
            text += f" (allowed: {allowed})"
        if suggestion:
            text += f"; did you mean {suggestion!r}?"
        super().__init__(text)


class FleetErrors(ValueError):
    """Several FleetErrors found in one pass, reported together."""

    def __init__(self, errors: list) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(error) for error in self.errors))
