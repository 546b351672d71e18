"""Translated streams classified by the client API's own classifier: the same story as the upstream's.

The gate decides on the upstream's events with the upstream's classifier and
stages or forwards what the translator made of them.  So what the client gets
must read the same under the client API's classifier (`apis/`): nothing that
commits while the upstream's events were still lifecycle, the client's first
output no earlier than the upstream's (at the same event for text), a failure
where the upstream failed with its message kept and judged the same by the
error policy, and a complete stream exactly when the upstream's was.  Every
recorded fixture of every API goes through each of the other three.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from switchyard_core.apis import APIS
from switchyard_core.apis.base import Classification, FrameKind
from switchyard_core.apis.errors import NEXT_UPSTREAM_CODES, Decision, ErrorPolicy
from switchyard_core.sse import FrameSplitter
from switchyard_core.translate.streams import stream_translator
from tests.support import gemini_wire, wire
from tests.test_translate_stream_sdk import validate_frames

FIXTURES = Path(__file__).parent / "fixtures"
PREFIXES = {"chat_": "openai-chat", "responses_": "openai-responses", "anthropic_": "anthropic-messages",
            "gemini_": "google-gemini"}
CASES = [(path.name, api, client) for path in sorted(FIXTURES.glob("*.sse"))
         for prefix, api in PREFIXES.items() if path.name.startswith(prefix)
         for client in APIS if client != api]
COMMITS = (FrameKind.OUTPUT, FrameKind.TERMINAL)
POLICY = ErrorPolicy()


@dataclass
class Walk:
    """Each upstream event's classification beside the client frames made of it."""

    steps: list[tuple[Classification, list[Classification]]] = field(default_factory=list)
    tail: list[Classification] = field(default_factory=list)  # what finish() wrote
    body: bytes = b""
    upstream_complete: bool = False
    client_complete: bool = False
    dropped: set[str] = field(default_factory=set)


def walk(up: str, client: str, frames: list[bytes], usage_wanted: bool = True) -> Walk:
    translator = stream_translator(up, client, model="m", usage_wanted=usage_wanted)
    up_classifier = APIS[up].stream_classifier()
    client_classifier = APIS[client].stream_classifier(usage_wanted)
    splitter, client_splitter = FrameSplitter(), FrameSplitter()
    result = Walk()
    for frame in splitter.feed(b"".join(frames)) + splitter.finish():
        kind = up_classifier.classify(frame.event)
        out = translator.feed(frame.event)
        result.body += out
        result.steps.append((kind, [client_classifier.classify(f.event) for f in client_splitter.feed(out)]))
    out = translator.finish()
    result.body += out
    result.tail = [client_classifier.classify(f.event) for f in client_splitter.feed(out) + client_splitter.finish()]
    result.upstream_complete = up_classifier.complete
    result.client_complete = client_classifier.complete
    result.dropped = translator.dropped
    return result


def first(kinds: list[list[Classification]], wanted: tuple[FrameKind, ...]) -> int | None:
    return next((i for i, step in enumerate(kinds) if any(c.kind in wanted for c in step)), None)


@pytest.mark.parametrize(("name", "up", "client"), CASES)
def test_client_reads_the_upstreams_story(name: str, up: str, client: str) -> None:
    result = walk(up, client, [(FIXTURES / name).read_bytes()])
    validate_frames(client, result.body)
    up_kinds = [[kind] for kind, _ in result.steps]
    client_kinds = [made for _, made in result.steps]
    up_commit, up_failure = first(up_kinds, COMMITS), first(up_kinds, (FrameKind.FAILURE,))
    # before the upstream committed, nothing the client got commits or fails
    for index in range(min(i for i in (up_commit, up_failure, len(up_kinds)) if i is not None)):
        assert all(c.kind not in COMMITS and c.kind is not FrameKind.FAILURE for c in client_kinds[index]), index
    client_commit = first(client_kinds + [result.tail], COMMITS)
    if up_commit is not None and (up_failure is None or up_commit < up_failure):
        # the upstream's output reached the client, or what it was is on record (redacted thinking),
        # or it is a call cut before its end, which a Gemini client only gets whole
        assert ((client_commit is not None and client_commit >= up_commit) or result.dropped
                or (client == "google-gemini" and not result.upstream_complete))
    if up_failure is not None:
        failure = result.steps[up_failure][0].error
        told = [c.error for c in client_kinds[up_failure] if c.kind is FrameKind.FAILURE]
        assert failure is not None and len(told) == 1 and told[0] is not None
        assert told[0].message == failure.message
        # the client's retry policy retries it exactly when Switchyard's did; Google tells a quota
        # as a rate limit (RESOURCE_EXHAUSTED), the difference is in details no other API has
        retried = POLICY.decide(failure) is Decision.RETRY
        if not (client == "google-gemini" and failure.code in NEXT_UPSTREAM_CODES):
            assert (POLICY.decide(told[0]) is Decision.RETRY) == retried, (failure, told[0])
        assert not any(c.kind is FrameKind.FAILURE for step in client_kinds[up_failure + 1:] for c in step)
        assert result.tail == []  # the client was told how it ended: nothing after the error
    elif client_commit is not None:
        assert result.client_complete == result.upstream_complete


TEXTS = {"openai-chat": wire.chat_stream("one two three"), "openai-responses": wire.responses_stream("one two three"),
         "anthropic-messages": wire.anthropic_stream("one two three"), "google-gemini": gemini_wire.stream("one two three")}


@pytest.mark.parametrize(("up", "client"), [(u, c) for u in APIS for c in APIS if u != c])
def test_text_commits_at_the_upstreams_first_text(up: str, client: str) -> None:
    result = walk(up, client, TEXTS[up])
    up_kinds = [[kind] for kind, _ in result.steps]
    client_kinds = [made for _, made in result.steps]
    assert first(client_kinds, COMMITS) == first(up_kinds, COMMITS)
    text_steps = [made for kind, made in result.steps if kind.kind is FrameKind.OUTPUT]
    assert all(any(c.kind is FrameKind.OUTPUT for c in made) for made in text_steps[:3])  # each word is output
    assert result.upstream_complete and result.client_complete


@pytest.mark.parametrize(("up", "client"), [(u, c) for u in APIS for c in APIS if u != c])
def test_tool_call_commits_no_earlier_than_upstream(up: str, client: str) -> None:
    result = walk(up, client, wire.tool_frames(up))
    up_commit = first([[kind] for kind, _ in result.steps], COMMITS)
    client_commit = first([made for _, made in result.steps], COMMITS)
    assert up_commit is not None and client_commit is not None and client_commit >= up_commit
    assert result.client_complete


@pytest.mark.parametrize("client", [c for c in APIS if c != "openai-chat"])
def test_an_error_after_text_is_told_once_in_the_clients_shape(client: str) -> None:
    frames = [*wire.chat_stream("partial answer")[:3], wire.chat_error(503, "provider overloaded"), wire.CHAT_DONE]
    result = walk("openai-chat", client, frames)
    validate_frames(client, result.body)
    told = [c for _, made in result.steps for c in made if c.kind is FrameKind.FAILURE]
    assert len(told) == 1 and told[0].error is not None
    assert told[0].error.message == "provider overloaded"
    if client == "google-gemini":
        assert json.loads(result.body.rsplit(b"data: ", 1)[1])["error"]["code"] == 503  # the status, kept
    if client == "anthropic-messages":
        assert told[0].error.type == "overloaded_error"  # what Claude Code retries on its own
    assert not result.client_complete


def test_keepalives_stay_keepalives() -> None:
    """A DeepSeek keepalive comment is a keepalive to every client (a blank line to Gemini's)."""
    for client in ("openai-responses", "anthropic-messages", "google-gemini"):
        result = walk("openai-chat", client, [b": keep-alive\n\n", *wire.chat_stream("hi")])
        gemini = client == "google-gemini"  # a blank line: no frame at all, only bytes on the wire
        assert [c.kind for c in result.steps[0][1]] == ([] if gemini else [FrameKind.KEEPALIVE])
        assert result.body.startswith(b"\r\ndata: " if gemini else b": keepalive\n\n")


def test_a_stream_cut_before_its_end_is_not_closed() -> None:
    """finish() after a cut writes nothing: the caller tells the client it was cut."""
    for client in ("openai-chat", "openai-responses", "google-gemini"):
        result = walk("anthropic-messages", client, wire.anthropic_stream("cut here")[:-2])
        assert result.tail == [] and not result.client_complete
