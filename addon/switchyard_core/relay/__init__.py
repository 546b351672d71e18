"""The side that serves mitmproxy: the loopback relay server and its connections."""

from .connection import PROVISIONAL_HEADER, TOKEN_HEADER
from .server import Relay

__all__ = ["PROVISIONAL_HEADER", "TOKEN_HEADER", "Relay"]
