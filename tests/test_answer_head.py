"""An upstream answer's head as Switchyard keeps it (pure): its own `${VAR}` values
redacted in every header, and a cookie from another origin than the client's
destination withheld, named (never its value) for the log."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.upstreams.answer_head import answer_headers, shown_names

SECRETS = (b"sk-own-KEY-12345678",)


def head(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_an_answer_from_the_clients_own_origin_keeps_its_cookies_and_loses_only_the_upstreams_key() -> None:
    kept, withheld = answer_headers(head(("Set-Cookie", "a=1"), ("WWW-Authenticate", 'Bearer token="sk-own-KEY-12345678"')),
                                    secrets=SECRETS, other_origin=False)
    assert list(kept.items()) == [("Set-Cookie", "a=1"), ("WWW-Authenticate", 'Bearer token="[redacted]"')]
    assert withheld == ()


def test_an_answer_from_another_origin_sets_no_cookie_for_the_client() -> None:
    kept, withheld = answer_headers(head(("Content-Type", "text/event-stream"), ("set-cookie", "gw=s3cret; Path=/"),
                                         ("Set-Cookie2", "old=1"), ("Set-Cookie", " spaced = v ; Secure")),
                                    secrets=(), other_origin=True)
    assert list(kept.items()) == [("Content-Type", "text/event-stream")]
    assert withheld == ("gw", "old", "spaced")


def test_nothing_to_do_costs_nothing() -> None:
    given = head(("Content-Type", "application/json"))
    assert answer_headers(given, secrets=(), other_origin=False) == (given, ())


def test_the_log_names_at_most_a_few_cookies() -> None:
    assert shown_names(tuple(f"c{i}" for i in range(10))) == "c0,c1,c2,c3,c4,c5,c6,c7,+2 more"
