"""An upstream's own key, and its cookies, never reach the client or mitmweb, through a
real mitmweb (a mitmdump with its web UI; its own flow list is read back).

Every upstream named `keyed` authenticates with `Bearer ${SWY_CRED_KEY}`; each
test has it echo that key where an upstream can put it (a WebSocket close
reason, an answer's header, a refused upgrade's head and body, a failed
attempt's answer) and asserts the client and mitmweb get `[redacted]` instead.
A backup on another origin sets a cookie: the client never keeps it as its
destination's (docs/security.md).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.conftest import CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import Mitmdump, free_port, mitmdump_on
from tests.support.ws_provider import Close, WsProvider, answer_turn, overload_turn
from tests.test_e2e_websocket import create, receive_turn

KEY = "sk-keyed-backup-KEY-7c8d9e0f"
KEYED = 'auth: {{header: Authorization, value: "Bearer ${{SWY_CRED_KEY}}"}}'
RULES = f"""\
version: 1
defaults: {{{{retries: 0, backoff_ms: 1, headers_timeout_s: 5, idle_timeout_s: 5, pre_answer_keepalive_s: 0}}}}
routes:
  - name: echo
    match: {{{{path: /echo/v1/chat/completions}}}}
    upstreams:
      - {{{{name: keyed, url: "http://127.0.0.1:{{p2}}/keyed/v1/chat/completions", {KEYED}}}}}
  - name: attempts
    match: {{{{path: /attempts/v1/chat/completions}}}}
    upstreams:
      - {{{{name: keyed, url: "http://127.0.0.1:{{p2}}/keyed/v1/chat/completions", {KEYED}}}}}
      - {{{{name: last, url: "http://127.0.0.1:{{p2}}/last/v1/chat/completions"}}}}
  - name: cookies
    match: {{{{path: /home/v1/chat/completions}}}}
    upstreams:
      - {{{{name: home, url: original}}}}
      - {{{{name: away, url: "http://127.0.0.1:{{p2}}/away/v1/chat/completions"}}}}
  - name: ws-close
    match: {{{{path: /wsclose/v1/responses}}}}
    upstreams:
      - {{{{name: w-primary, url: original}}}}
      - {{{{name: keyed, url: "{{backup}}", websocket: true, {KEYED}}}}}
  - name: ws-refused
    match: {{{{path: /wsrefused/v1/responses}}}}
    upstreams:
      - {{{{name: keyed, url: "{{plain}}", websocket: true, {KEYED}}}}}
      - {{{{name: w-backup, url: "{{backup}}"}}}}
"""
ECHO = f'Bearer realm="api", error="invalid_token", token="{KEY}"'


@pytest.fixture(scope="module")
def web(provider: FakeProvider, backup_provider: WsProvider, plain_provider: WsProvider,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    rules = RULES.format(p2=provider.ports[1], backup=backup_provider.http_url, plain=plain_provider.http_url)
    with mitmdump_on(tmp_path_factory.mktemp("hostile-credentials"), rules, web=True, env={"SWY_CRED_KEY": KEY},
                     extra_args=["--set", "web_open_browser=false", "--set", f"web_port={free_port()}"]) as dump:
        yield dump


@pytest.fixture
def cenv(provider: FakeProvider, web: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, web, Path(web.log_path).parent / "rules.yaml")
    provider.reset()


def _get(web: Mitmdump, path: str) -> bytes:
    base, _, token = web.web_url.partition("/?token=")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    with opener.open(request, timeout=10) as answer:
        return answer.read()


def attempt_flow(web: Mitmdump, comment: str) -> tuple[dict, bytes]:
    """The attempt flow whose comment names it so (`attempt N (route: upstream)`; bounded wait), and its response body."""
    deadline = time.monotonic() + 10
    while True:
        found = [f for f in json.loads(_get(web, "/flows")) if f"; {comment}" in f.get("comment", "")]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert found, f"no attempt flow {comment!r} in mitmweb"
    return found[-1], _get(web, f"/flows/{found[-1]['id']}/response/content.data")


# --- 1: a WebSocket close reason ------------------------------------------------------------


async def test_a_backups_close_reason_reaches_the_client_with_its_key_redacted(
        web: Mitmdump, primary: WsProvider, backup: WsProvider) -> None:
    """The primary fails before output; the keyed backup streams some of its answer, then
    closes with 1008 and a reason naming the key it was given."""
    primary.script(overload_turn("resp_p"))
    backup.script([*answer_turn("resp_b")[:5], Close(1008, f"bad key Bearer {KEY}")])
    mark = web.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("wsclose"), proxy=web.proxy_url) as ws:
            await ws.send_str(create("hi"))
            got = [(await ws.receive(timeout=10)).data for _ in range(5)]
            closed = await ws.receive(timeout=10)
    assert got == answer_turn("resp_b")[:5]
    assert backup.handshakes[0]["Authorization"] == f"Bearer {KEY}"  # it was given the key
    assert closed.type is aiohttp.WSMsgType.CLOSE
    assert (closed.data, closed.extra) == (1008, "bad key Bearer [redacted]")
    assert KEY not in web.wait_for_log("switchyard.websocket_closed", mark)


# --- 2: an answer's headers ------------------------------------------------------------------


@pytest.mark.parametrize("reply", [
    Reply.json(401, {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "invalid_request_error"}},
               headers={"WWW-Authenticate": ECHO}),
    Reply.sse(*wire.chat_stream("fine"), headers={"WWW-Authenticate": ECHO}),
], ids=["refused", "answered"])
def test_a_backups_key_in_an_answer_header_reaches_the_client_redacted(cenv: Env, reply: Reply) -> None:
    cenv.provider.script("keyed", reply)
    mark = cenv.mitm.log_mark()
    result = cenv.curl(cenv.provider.url("echo", "/v1/chat/completions"), cenv.chat_body())
    assert result.status == reply.status
    assert result.headers["www-authenticate"] == ECHO.replace(KEY, "[redacted]")
    assert KEY.encode() not in result.body
    assert cenv.provider.calls_to("keyed")[0].headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in cenv.mitm.log_since(mark)


# --- 3: mitmweb's attempt flows ---------------------------------------------------------------


def test_a_failed_http_attempt_shows_in_mitmweb_with_its_key_redacted_in_headers_and_body(cenv: Env) -> None:
    cenv.provider.script("keyed", Reply.json(503, {"error": {"message": f"key {KEY} is overloaded"}},
                                             headers={"WWW-Authenticate": ECHO, "X-Echo": f"Bearer {KEY}"}))
    result = cenv.curl(cenv.provider.url("attempts", "/v1/chat/completions"), cenv.chat_body())
    assert result.body == b"".join(wire.chat_stream(wire.answer_text("last")))
    flow, body = attempt_flow(cenv.mitm, "attempt 1 (attempts: keyed)")
    headers = dict(flow["response"]["headers"])
    assert headers["WWW-Authenticate"] == ECHO.replace(KEY, "[redacted]")
    assert headers["X-Echo"] == "Bearer [redacted]"
    assert json.loads(body) == {"error": {"message": "key [redacted] is overloaded"}}
    assert KEY not in json.dumps(flow)


async def test_a_refused_websocket_upgrade_shows_in_mitmweb_with_its_key_redacted(
        web: Mitmdump, primary: WsProvider, backup: WsProvider, plain: WsProvider) -> None:
    plain.refusal, plain.refusal_text = 503, f"upstream busy; key {KEY} was fine"
    plain.refusal_headers = {"WWW-Authenticate": ECHO}
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("wsrefused"), proxy=web.proxy_url) as ws:
            await ws.send_str(create("hi"))
            assert await receive_turn(ws) == answer_turn("resp_default1")  # w-backup's
    assert plain.handshakes[0]["Authorization"] == f"Bearer {KEY}"
    flow, body = attempt_flow(web, "attempt 1 (ws-refused: keyed)")
    assert flow["response"]["status_code"] == 503
    assert {k.lower(): v for k, v in flow["response"]["headers"]}["www-authenticate"] == ECHO.replace(KEY, "[redacted]")
    assert body == b"upstream busy; key [redacted] was fine"
    assert KEY not in json.dumps(flow)


# --- 4: cookies from another origin -----------------------------------------------------------


def test_a_cookie_set_by_a_backup_on_another_origin_never_returns_to_the_clients_destination(cenv: Env) -> None:
    """The openai SDK keeps cookies.  The first answer is the backup's (another origin),
    which sets one; the second is the home upstream's own, which sets one too: only the
    home upstream's own cookie comes back to it."""
    cenv.provider.script("home", Reply.sse(wire.chat_error(503, "overloaded")),
                         Reply.sse(*wire.chat_stream("home"), headers={"Set-Cookie": "home_session=h1; Path=/"}),
                         Reply.sse(*wire.chat_stream("again")))
    cenv.provider.script("away", Reply.sse(*wire.chat_stream("away"),
                                           headers={"Set-Cookie": "gw_session=away-SECRET-1; Path=/; HttpOnly"}))
    oai = openai.OpenAI(api_key=CLIENT_SECRET, base_url=cenv.provider.url("home", "/v1"), max_retries=0,
                        http_client=openai.DefaultHttpxClient(proxy=cenv.mitm.proxy_url, trust_env=False))
    mark = cenv.mitm.log_mark()
    texts = []
    for _ in range(3):
        chunks = oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True)
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert texts == ["away", "home", "again"]
    assert [c.upstream for c in cenv.provider.calls] == ["home", "away", "home", "home"]
    home = cenv.provider.calls_to("home")
    assert "Cookie" not in home[1].headers  # the backup's cookie never came back here
    assert home[2].headers["Cookie"] == "home_session=h1"  # the home upstream's own did
    log = cenv.mitm.wait_for_log("switchyard.cookie_not_forwarded", mark)
    line = next(line for line in log.splitlines() if "switchyard.cookie_not_forwarded" in line)
    assert f"origin=http://127.0.0.1:{cenv.provider.ports[1]}" in line and "cookies=gw_session" in line
    assert "away-SECRET-1" not in log
