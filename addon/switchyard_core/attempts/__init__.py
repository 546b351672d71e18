"""The attempt core between the two sides: one machine per exchange that decides
which upstream is tried and how the exchange ends (machine.py), and the driver
that does its I/O (driver.py)."""

from .client_stream import HeldSink
from .driver import Driver
from .machine import ExchangeMachine

__all__ = ["Driver", "ExchangeMachine", "HeldSink"]
