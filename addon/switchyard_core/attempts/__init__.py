"""The attempt loop between the two sides: which upstream is tried, and how the exchange ends."""

from .loop import AttemptLoop

__all__ = ["AttemptLoop"]
