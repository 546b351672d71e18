"""The side that calls upstreams: the HTTP/1.1 client, its connections and what they carry."""

from .client import UpstreamClient

__all__ = ["UpstreamClient"]
