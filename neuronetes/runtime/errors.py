"""The runtime library's exceptions: one base class, a refusal at admission, a bad argument."""

from __future__ import annotations


class RuntimeErrorBase(Exception):
    """Every error the runtime raises on purpose derives from this."""


class AdmissionError(RuntimeErrorBase):
    """A task or slice the scheduler cannot take: its hard request is over what is free.

    `resource` is ``"memory"`` (bytes) or ``"bandwidth"`` (a share of the device); `shortfall` is
    how much more would have to be free for the request to fit; `reason`, when given, says why
    what looks free is not (pinned arrays, the device's own refusal).
    """

    def __init__(
        self, resource: str, requested: float, free: float, what: str = "task", reason: str = ""
    ) -> None:
        self.resource = resource
        self.requested = requested
        self.free = free
        self.shortfall = requested - free
        if resource == "memory":
            detail = (
                f"{int(requested)} bytes requested, {int(free)} free: short by {int(self.shortfall)} bytes"
            )
        else:
            detail = f"{requested:g} requested, {free:g} free: short by {self.shortfall:.4g}"
        super().__init__(f"{what} not admitted: {resource} {detail}" + (f" ({reason})" if reason else ""))


class InvalidArgument(RuntimeErrorBase, ValueError):
    """An argument the runtime cannot use; `argument` names it, the message says what it must be."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {message}")
