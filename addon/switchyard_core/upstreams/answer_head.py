"""An upstream answer's head as Switchyard may use it, decided once, as it arrives.

Everything downstream of the upstream client (the client's head, an exhausted
exchange's forwarded failure, the attempt flows in mitmweb, the log) reads
these headers, so two rules are applied here, to every answer of every
attempt, continuation and WebSocket turn over HTTP alike (see
docs/architecture.md, "Behaviour", and docs/security.md):

- a value the upstream's `${VAR}`s hold is redacted in every header value (a
  401's `WWW-Authenticate` may name the key it refused);
- a cookie set by an upstream on another origin than the client's destination
  is not passed on: the client would keep it as its destination's and send it
  there (the openai SDK keeps cookies).  The client's own cookies never go to
  another origin either (`messages.build_request`).
"""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from ..redaction import redact_text

SET_COOKIE = frozenset({"set-cookie", "set-cookie2"})
_NAMES_SHOWN = 8  # cookie names in the log line, at most


def answer_headers(headers: CIMultiDictProxy[str], *, secrets: tuple[bytes, ...],
                   other_origin: bool) -> tuple[CIMultiDictProxy[str], tuple[str, ...]]:
    """The headers as Switchyard keeps them, and the names of the cookies withheld."""
    if not secrets and not other_origin:
        return headers, ()
    withheld: list[str] = []
    kept: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if other_origin and name.lower() in SET_COOKIE:
            withheld.append(cookie_name(value))
            continue
        kept.add(name, redact_text(value, secrets) if secrets else value)
    return CIMultiDictProxy(kept), tuple(withheld)


def cookie_name(set_cookie: str) -> str:
    """The name a `Set-Cookie` value sets (`gw_session=...; Path=/` -> `gw_session`), shown
    in the log instead of its value, which is a credential."""
    return set_cookie.partition(";")[0].partition("=")[0].strip()[:64]


def shown_names(names: tuple[str, ...]) -> str:
    more = len(names) - _NAMES_SHOWN
    return ",".join(names[:_NAMES_SHOWN]) + (f",+{more} more" if more > 0 else "")
