"""The loopback relay (server), its upstream plumbing and the attempt loop."""

from .exchange import AttemptRecord, Exchange, FlowAddress, OriginalRequest
from .relay_connection import PROVISIONAL_HEADER, TOKEN_HEADER
from .server import Relay
from .upstream_client import UpstreamClient

__all__ = ["PROVISIONAL_HEADER", "TOKEN_HEADER", "AttemptRecord", "Exchange", "FlowAddress", "OriginalRequest", "Relay",
           "UpstreamClient"]
