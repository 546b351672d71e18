"""Exchanges that must come to an end through a real mitmdump, whatever an upstream's
address or answer is: the client gets an answer (the backup's, or an error in its
API's shape) instead of waiting until it gives up."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Env
from tests.support import wire
from tests.support.fake_provider import FakeProvider
from tests.support.mitm import Mitmdump, mitmdump_on

RULES = """\
version: 1
defaults: {{retries: 0, backoff_ms: 1, pre_answer_keepalive_s: 0, max_skip_s: 0, unreachable_skip_s: 0}}
routes:
  - name: typo
    match: {{path: /typo/v1/chat/completions}}
    upstreams:
      # a host no DNS name can have (an empty label): a typo in the rules
      - {{name: typo, url: "http://api..example.com/v1/chat/completions"}}
      - {{name: backup-typo, url: "http://127.0.0.1:{port}/backup-typo/v1/chat/completions"}}
"""


@pytest.fixture(scope="module")
def ending(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("ending"), RULES.format(port=provider.ports[1]),
                     reverse_target=f"http://127.0.0.1:{provider.ports[0]}") as dump:
        yield dump


@pytest.fixture
def eenv(provider: FakeProvider, ending: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, ending, ending.log_path.parent / "rules.yaml")
    provider.reset()


def test_an_upstream_host_that_cannot_be_a_dns_name_is_a_failure_to_reach_it(eenv: Env) -> None:
    """It cannot be resolved, as a name that does not exist cannot: the backup answers
    (before, the attempt's task died and the client waited until it gave up)."""
    result = eenv.curl(eenv.provider.url("typo", "/v1/chat/completions"), eenv.chat_body(), max_time=10)
    assert (result.status, result.returncode) == (200, 0)
    assert result.body == b"".join(wire.chat_stream(wire.answer_text("backup-typo")))
    assert result.headers["x-switchyard-attempts"] == "2"
    log = eenv.mitm.log_since(0)
    assert "switchyard.attempt_failed route=typo upstream=typo" in log and "name does not resolve" in log
