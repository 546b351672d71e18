"""Which host a flow is for, as routes match it.

Most listeners give a flow the name the client asked for.  A transparent, local,
WireGuard or TUN listener knows only the destination's IP address: the name the
client meant is in its `Host` header (or else its TLS handshake's SNI), and the
address is where that name is reached.  And a flow's listener may send it through
an upstream proxy (`upstream_proxy_of`), which its attempts go through too.
"""

from __future__ import annotations

import ipaddress

from mitmproxy import connection, http

ADDRESS_ONLY_MODES = frozenset({"transparent", "local", "wireguard", "tun"})


def destination(flow: http.HTTPFlow) -> tuple[str, str | None]:
    """The host a flow is for, as routes match it; and, where the flow's URL holds the
    destination's address instead, that address."""
    request = flow.request
    if flow.client_conn.proxy_mode.type_name in ADDRESS_ONLY_MODES:
        named = request.pretty_host if request.host_header else (flow.client_conn.sni or "")
        if named and not _is_address(named) and named.lower() != request.host.lower():
            return named, request.host
    return request.host, None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def named_url(request: http.Request, name: str) -> str:
    """The request's URL with the name the client meant in place of the address."""
    default = 443 if request.scheme == "https" else 80
    netloc = name if request.port == default else f"{name}:{request.port}"
    return f"{request.scheme}://{netloc}{request.path}"


def upstream_proxy_of(server: connection.Server) -> str | None:
    """The upstream proxy mitmproxy would send this flow through: its listener's
    upstream mode (each `--mode` is its own listener; regular and reverse ones have none)."""
    if server.via is None:
        return None
    scheme, (host, port) = server.via
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}"
