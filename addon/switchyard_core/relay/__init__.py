"""The loopback relay (server), its upstream plumbing and the attempt loop."""

from .exchange import AttemptRecord, Exchange, OriginalRequest
from .server import PROVISIONAL_HEADER, TOKEN_HEADER, Relay
from .upstream_client import UpstreamClient

__all__ = ["PROVISIONAL_HEADER", "TOKEN_HEADER", "AttemptRecord", "Exchange", "OriginalRequest", "Relay", "UpstreamClient"]
