"""Gemini requests as each upstream gets them: the model and method in the path, the
client's query (`alt=sse`) kept and its `key` kept at home, the body untouched."""

from __future__ import annotations

import json

import pytest

from switchyard_core.apis import api_for_path
from switchyard_core.apis.google_gemini import model_call, model_in_path, streams, upstream_path
from switchyard_core.exchange import OriginalRequest
from switchyard_core.rules import SHIPPED_RULES, Upstream, load_rules
from switchyard_core.redaction import credential_query_values
from switchyard_core.upstreams.messages import build_request, target_url


@pytest.mark.parametrize(
    ("original", "upstream", "model", "expected"),
    [
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", None, None,
         "/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", None, "gemini-2.5-flash",
         "/v1beta/models/gemini-2.5-flash:streamGenerateContent"),
        # a base URL (as GOOGLE_GEMINI_BASE_URL): the request's path is appended
        ("/v1beta/models/gemini-2.5-pro:generateContent", "", None, "/v1beta/models/gemini-2.5-pro:generateContent"),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "/gateway/", "gemini-2.5-flash",
         "/gateway/v1beta/models/gemini-2.5-flash:generateContent"),
        # a URL naming a model call keeps its prefix and model; the method is the request's
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", "/v1/models/gemini-2.0-flash:generateContent", None,
         "/v1/models/gemini-2.0-flash:streamGenerateContent"),
    ],
)
def test_upstream_paths(original: str, upstream: str | None, model: str | None, expected: str) -> None:
    assert upstream_path(original, upstream, model) == expected


def test_model_call_reads_the_model_from_the_path() -> None:
    call = model_call("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    assert call is not None and (call.model, call.method) == ("gemini-2.5-flash", "streamGenerateContent")
    assert model_call("/v1/chat/completions") is None


def test_a_percent_encoded_path_is_read_as_google_reads_it() -> None:
    """Google decodes the names in a path (`%2D` is `-`), but only a literal `:` starts
    the method: `…gemini-2.5-pro%3AstreamGenerateContent` is a model named with a colon,
    which Google answers 404."""
    encoded = "/v1beta/models/gemini%2D2.5-pro:streamGenerateContent"
    assert model_in_path(encoded) == "gemini-2.5-pro"  # the route for gemini-2.5-pro* takes it
    assert streams(encoded + "?alt=sse")
    # the request's own path goes on as the client wrote it; a rewritten model replaces the name
    assert upstream_path(encoded, None, None) == encoded
    assert upstream_path(encoded, None, "gemini-2.5-flash") == "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    colon = "/v1beta/models/gemini-2.5-pro%3AstreamGenerateContent"
    assert model_call(colon) is None and model_in_path(colon) is None and not streams(colon + "?alt=sse")
    # never rewritten into another request (it was the model, minus its would-be method)
    assert upstream_path(colon, None, "gemini-2.5-flash") is None
    assert upstream_path(colon, "/gateway", "gemini-2.5-flash") == "/gateway" + colon
    assert target_url(f"https://generativelanguage.googleapis.com{colon}?alt=sse", None, "gemini-2.5-flash",
                      "google-gemini") == f"https://generativelanguage.googleapis.com{colon}?alt=sse"


GEMINI_URL = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:streamGenerateContent"


@pytest.mark.parametrize(
    ("upstream_url", "model", "expected"),
    [
        (None, None, f"{GEMINI_URL}?alt=sse&key=AIza-client"),
        (None, "gemini-2.5-flash", GEMINI_URL.replace("2.5-pro", "2.5-flash") + "?alt=sse&key=AIza-client"),
        # same origin: the client's key may go along
        ("https://generativelanguage.googleapis.com", None, f"{GEMINI_URL}?alt=sse&key=AIza-client"),
        # another origin: never the client's key; the upstream's own first, then what it does not set
        ("https://backup.example.com?key=AIza-backup", None,
         "https://backup.example.com/v1beta/models/gemini-2.5-pro:streamGenerateContent?key=AIza-backup&alt=sse"),
        ("https://backup.example.com/gw/", "gemini-2.5-flash",
         "https://backup.example.com/gw/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"),
        ("https://backup.example.com/v1/models/gemini-2.0-flash:generateContent?alt=json", None,
         "https://backup.example.com/v1/models/gemini-2.0-flash:streamGenerateContent?alt=json"),
    ],
)
def test_gemini_target_urls(upstream_url: str | None, model: str | None, expected: str) -> None:
    assert target_url(f"{GEMINI_URL}?alt=sse&key=AIza-client", upstream_url, model, "google-gemini") == expected


@pytest.mark.parametrize(
    ("path", "upstream_url", "expected"),
    [
        # a token count goes where the answer would, as a token count
        ("/v1beta/models/gemini-2.5-pro:countTokens", "https://b.example/v1/models/gemini-2.0-flash:generateContent",
         "https://b.example/v1/models/gemini-2.0-flash:countTokens"),
        ("/v1beta/models/gemini-2.5-pro:countTokens", "https://b.example/gw", "https://b.example/gw/v1beta/models/gemini-2.5-pro:countTokens"),
        # no model call at all: a base URL still takes the request's path; a model call's URL is kept as written
        ("/v1beta/files", "https://b.example/gw", "https://b.example/gw/v1beta/files"),
        ("/v1beta/files", "https://b.example/v1/models/m:generateContent", "https://b.example/v1/models/m:generateContent"),
    ],
)
def test_gemini_target_urls_of_other_calls(path: str, upstream_url: str, expected: str) -> None:
    assert target_url(f"https://generativelanguage.googleapis.com{path}", upstream_url, None, "google-gemini") == expected


def test_other_apis_keep_their_urls_and_their_body_model() -> None:
    original = "https://api.openai.com/v1/models/gpt-4o"
    assert target_url(original, "https://b.example/v1/chat/completions", "gpt-4o-mini", "openai-chat") == \
        "https://b.example/v1/chat/completions"
    assert model_in_path("/v1/models/gpt-4o") is None  # OpenAI's own: no model to route by
    assert model_in_path("/v1beta/models/gemini-2.5-pro:countTokens") == "gemini-2.5-pro"


def test_a_gemini_upstreams_model_goes_in_the_path_not_the_body() -> None:
    body = json.dumps({"contents": [{"parts": [{"text": "hi"}]}]}).encode()
    original = OriginalRequest.of("POST", f"{GEMINI_URL}?alt=sse", (("x-goog-api-key", "AIza-client"),), body,
                                  json.loads(body))
    assert original.wants_stream  # said by the URL
    array = OriginalRequest.of("POST", GEMINI_URL, (), body, json.loads(body))
    assert not array.wants_stream  # no alt=sse: a JSON array, held whole
    backup = Upstream(name="backup", url="https://backup.example.com", model="gemini-2.5-flash", retries=0,
                      auth=("x-goog-api-key", "AIza-backup"), headers=())
    asked = build_request(original, backup, "google-gemini")
    assert asked.body == body
    assert asked.url == "https://backup.example.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert [value for name, value in asked.headers if name.lower() == "x-goog-api-key"] == ["AIza-backup"]


def test_credential_query_values() -> None:
    assert credential_query_values(f"{GEMINI_URL}?alt=sse&key=AIza%2Dclient", "https://b.example?x=1") == ["AIza-client"]


def test_the_shipped_rules_route_geminis_calls() -> None:
    rules = load_rules(SHIPPED_RULES)
    for path in ("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "/v1/models/gemini-2.5-flash:generateContent"):
        route = rules.route_for("generativelanguage.googleapis.com", path, lambda: None)
        assert route is not None and (route.name, route.api) == ("gemini", "google-gemini")


def test_a_same_origin_upstream_with_its_own_key_gets_none_of_the_clients() -> None:
    """Google answers a call carrying two credentials with 400 INVALID_ARGUMENT."""
    original = OriginalRequest.of("POST", f"{GEMINI_URL}?alt=sse", (("x-goog-api-key", "AIza-client"),
                                                                     ("Authorization", "Bearer client")), b"{}", {})
    backup = Upstream(name="backup", url="https://generativelanguage.googleapis.com?key=AIza-backup", model=None,
                      retries=0, auth=None, headers=())
    asked = build_request(original, backup, "google-gemini")
    assert asked.url == f"{GEMINI_URL}?key=AIza-backup&alt=sse"
    assert [name for name, _ in asked.headers if name.lower() in ("x-goog-api-key", "authorization")] == []


def test_a_same_origin_upstream_with_its_own_auth_header_gets_no_client_key_in_the_query() -> None:
    original = OriginalRequest.of("POST", f"{GEMINI_URL}?alt=sse&key=AIza-client", (), b"{}", {})
    backup = Upstream(name="backup", url="https://generativelanguage.googleapis.com", model=None,
                      retries=0, auth=("x-goog-api-key", "AIza-backup"), headers=())
    asked = build_request(original, backup, "google-gemini")
    assert asked.url == f"{GEMINI_URL}?alt=sse"
    assert [value for name, value in asked.headers if name.lower() == "x-goog-api-key"] == ["AIza-backup"]


@pytest.mark.parametrize(
    ("original", "model", "expected"),
    [
        # a model written with its collection is not written twice
        ("/v1beta/models/gemini-2.5-pro:generateContent", "models/gemini-2.5-flash",
         "/v1beta/models/gemini-2.5-flash:generateContent"),
        # a tuned model keeps its collection; a plain id goes under models/
        ("/v1beta/tunedModels/t1:streamGenerateContent", None, "/v1beta/tunedModels/t1:streamGenerateContent"),
        ("/v1beta/tunedModels/t1:streamGenerateContent", "gemini-2.5-flash",
         "/v1beta/models/gemini-2.5-flash:streamGenerateContent"),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "tunedModels/t2", "/v1beta/tunedModels/t2:generateContent"),
    ],
)
def test_an_upstreams_model_is_written_once_in_its_collection(original: str, model: str | None, expected: str) -> None:
    assert upstream_path(original, None, model) == expected


def test_tuned_model_calls_are_geminis() -> None:
    url = "https://generativelanguage.googleapis.com/v1beta/tunedModels/t1:streamGenerateContent?alt=sse"
    assert streams(url)
    assert model_in_path("/v1beta/tunedModels/t1:streamGenerateContent") == "t1"
    assert api_for_path("/v1beta/tunedModels/t1:streamGenerateContent") == "google-gemini"
