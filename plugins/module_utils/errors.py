"""The one error the fleet model raises: it names the host, the role and the field to fix."""

from __future__ import annotations


class FleetError(ValueError):
    """An inventory that cannot work, with where it goes wrong."""

    def __init__(self, host: str, role: str | None, field: str, message: str) -> None:
        self.host = host
        self.role = role
        self.field = field
        self.reason = message
        where = f"host {host}" + (f", role {role}" if role else "") + f", field {field}"
        super().__init__(f"{where}: {message}")


class FleetErrors(ValueError):
    """Several FleetErrors found in one pass, reported together."""

    def __init__(self, errors: list) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(error) for error in self.errors))
