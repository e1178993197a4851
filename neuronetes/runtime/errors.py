"""The runtime's exceptions."""

from __future__ import annotations

__all__ = ["AdmissionError"]


class AdmissionError(Exception):
    """A task or reservation that cannot be admitted; the message names the shortfall."""
