"""rules.yaml: the public contract, its defaults, and errors that name file, line and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard_core.rules import SHIPPED_RULES, AttemptSettings, RulesError, load_rules
from switchyard_core.rules.schema import Settings

MINIMAL = """\
version: 1
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    upstreams:
      - name: openai
        url: original
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(RulesError) as caught:
        load_rules(write(tmp_path, text))
    return str(caught.value)


def test_shipped_rules_cover_the_four_apis_with_original_destinations() -> None:
    rules = load_rules(SHIPPED_RULES)
    assert [(r.name, r.api, r.host, r.path) for r in rules.routes] == [
        ("openai-chat", "openai-chat", "api.openai.com", "/v1/chat/completions"),
        ("openai-responses", "openai-responses", "api.openai.com", "/v1/responses"),
        ("anthropic-messages", "anthropic-messages", "api.anthropic.com", "/v1/messages"),
        ("gemini", "google-gemini", "generativelanguage.googleapis.com", "/v1*/models/*"),
    ]
    assert all(u.is_original and u.retries >= 1 for r in rules.routes for u in r.upstreams)
    assert "backup.example.com" in SHIPPED_RULES.read_text()  # the commented backup example
    assert rules.warnings == ()


def test_defaults_match_the_design_and_routes_override_them(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, MINIMAL + "    retries: 3\n    staging_limit: 1MiB\n    retry_on: [503]\n"))
    settings = rules.routes[0].settings
    assert settings.retries == 3
    assert settings.staging_limit == 1024 * 1024
    assert settings.retry_on == frozenset({503})
    assert (settings.backoff_ms, settings.max_backoff_ms, settings.headers_timeout_s, settings.idle_timeout_s) == (250, 4000, 30, 60)
    assert (settings.first_output_timeout_s, settings.pre_answer_keepalive_s, settings.request_timeout_s) == (0, 15, 600)
    assert settings.rewrite_capacity_codes is True
    assert rules.routes[0].upstreams[0].retries == 3


def test_upstream_retries_override_the_route(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, MINIMAL.replace("url: original", "url: original\n        retries: 0")))
    assert rules.routes[0].upstreams[0].retries == 0


@pytest.mark.parametrize("written,value", [(None, None), ("auto", None), ("true", True), ("false", False)])
def test_an_upstream_says_whether_it_speaks_websocket(tmp_path: Path, written: str | None, value: bool | None) -> None:
    extra = f"\n        websocket: {written}" if written else ""
    rules = load_rules(write(tmp_path, MINIMAL.replace("url: original", "url: original" + extra)))
    assert rules.routes[0].upstreams[0].websocket is value


@pytest.mark.parametrize("written", ["1", "sometimes", "\"true\""])
def test_websocket_takes_auto_true_or_false_only(tmp_path: Path, written: str) -> None:
    message = error_of(tmp_path, MINIMAL.replace("url: original", f"url: original\n        websocket: {written}"))
    assert "websocket" in message


@pytest.mark.parametrize("path,api", [("/v1/chat/completions", "openai-chat"), ("/v1/responses", "openai-responses"), ("/v1/messages", "anthropic-messages")])
def test_api_is_inferred_from_the_path(tmp_path: Path, path: str, api: str) -> None:
    rules = load_rules(write(tmp_path, MINIMAL.replace("/v1/chat/completions", path)))
    assert rules.routes[0].api == api


def test_environment_variables_expand_in_upstream_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWY_KEY", "sk-123")
    rules = load_rules(write(tmp_path, MINIMAL + """\
      - name: backup
        url: https://backup.example.com/v1/chat/completions
        auth: {header: Authorization, value: "Bearer ${SWY_KEY}"}
        headers: {X-Key: "${SWY_KEY}"}
"""))
    backup = rules.routes[0].upstreams[1]
    assert backup.auth == ("Authorization", "Bearer sk-123")
    assert backup.headers == (("X-Key", "sk-123"),)


@pytest.mark.parametrize(
    "value,upstream,warning",
    [
        (None, 'url: https://backup.example.com/v1/chat/completions\n        auth: {header: Authorization, value: "Bearer ${SWY_VAR}"}',
         "${SWY_VAR} is not set"),
        # a key read from a file with its newline: never reaches a header
        ("sk-from-a-file\n", 'url: https://backup.example.com/v1/chat/completions\n        auth: {header: Authorization, value: "Bearer ${SWY_VAR}"}',
         "${SWY_VAR} holds a line break or another control character (a key read from a file with its newline?)"),
        # checked once expanded, at load time (not at the first request)
        ("sk-oops-SECRET", 'url: "${SWY_VAR}"', "its url with ${SWY_VAR} expanded is not an http(s) URL"),
    ],
    ids=["unset", "line-break", "url-not-http"],
)
def test_an_upstream_whose_variable_does_not_fit_is_skipped_with_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None, upstream: str, warning: str) -> None:
    """The rest of the route goes on; the warning names the file and line, never the value."""
    if value is None:
        monkeypatch.delenv("SWY_VAR", raising=False)
    else:
        monkeypatch.setenv("SWY_VAR", value)
    path = write(tmp_path, MINIMAL + f"      - name: backup\n        {upstream}\n")
    rules = load_rules(path)
    assert [u.name for u in rules.routes[0].upstreams] == ["openai"]
    assert rules.warnings == (f"{path}:8: upstream 'backup' skipped: {warning}",)
    if value:
        assert value.strip() not in " ".join(rules.warnings)


def test_route_match_globs(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, MINIMAL.replace("{path: /v1/chat/completions}", '{host: "*.openai.com", path: /v1/chat/completions, model: "gpt-4o*"}')))
    route = rules.routes[0]
    assert rules.route_for("api.openai.com", "/v1/chat/completions?x=1", lambda: "gpt-4o-mini") is route
    assert rules.route_for("api.openai.com", "/v1/chat/completions", lambda: "o3") is None
    assert rules.route_for("example.com", "/v1/chat/completions", lambda: "gpt-4o") is None
    assert rules.route_for("api.openai.com", "/v1/embeddings", lambda: "gpt-4o") is None


@pytest.mark.parametrize(
    "text,expected",
    [
        (MINIMAL.replace("url: original", "url: original\n        retries: lots"), ":8: routes[0].upstreams[0].retries: Input should be a valid integer"),
        (MINIMAL.replace("url: original", "url: original\n        retry: 1"), ":8: routes[0].upstreams[0].retry: not a known key here (did you mean retries?)"),
        (MINIMAL + "    staging_limit: eight\n", ":8: routes[0].staging_limit: not a size: 'eight'"),
        (MINIMAL.replace("version: 1", "version: 2"), ":1: version: Input should be 1"),
        (MINIMAL.replace("url: original", "url: ftp://x"), ":7: routes[0].upstreams[0].url: must be `original` or an http(s) URL"),
        (MINIMAL.replace("{path: /v1/chat/completions}", "{path: /v1/embeddings}"), ":3: routes[0].api: cannot infer the API"),
        (MINIMAL + MINIMAL.split("routes:\n")[1], ":8: routes[1].name: duplicate route name 'chat'"),
        (MINIMAL + "faults:\n  - {route: nope, kind: sse_error}\n", ":9: faults[0].route: no route named 'nope'"),
        (MINIMAL + "faults:\n  - {route: chat, kind: explode}\n", ":9: faults[0].kind: Input should be 'sse_error'"),
        ("version: 1\nroutes: [\n", ":3: invalid YAML"),
        ("", ":1: the file is empty"),
        ("routes: []\n", ":1: version: Field required"),
        (MINIMAL.replace("url: original", "url: original\n        retries: 2\n        retries: 5"),
         ":9: routes[0].upstreams[0].retries: given twice (the first is line 8)"),
        (MINIMAL + "routes: []\n", ":8: routes: given twice (the first is line 2)"),
    ],
    ids=["wrong-type", "unknown-key", "bad-size", "bad-version", "bad-url", "no-api", "duplicate-route", "fault-route",
         "fault-kind", "yaml-syntax", "empty", "no-version", "duplicate-key", "duplicate-section"],
)
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith(str(tmp_path / "rules.yaml") + ":")
    assert expected in message


def test_every_problem_is_named_at_once_in_file_order(tmp_path: Path) -> None:
    """One restart per mistake wastes a user's time: all of them, each with its line."""
    text = MINIMAL.replace("version: 1", "version: 1\ndefaults:\n  backof_ms: 3\n  retries: many")
    text = text.replace("url: original", "url: original\n        modle: gpt-4o")
    lines = error_of(tmp_path, text).splitlines()
    name = str(tmp_path / "rules.yaml")
    assert lines == [
        f"{name}:3: defaults.backof_ms: not a known key here (did you mean backoff_ms?)",
        f"{name}:4: defaults.retries: Input should be a valid integer, unable to parse string as an integer",
        f"{name}:11: routes[0].upstreams[0].modle: not a known key here (did you mean model?)",
    ]


def test_every_problem_beyond_the_schema_is_named_at_once_too(tmp_path: Path) -> None:
    text = """\
version: 1
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    upstreams:
      - {name: openai, url: ftp://x}
      - {name: openai, url: original}
  - name: chat
    match: {path: /v1/chat/completions}
    upstreams: [{name: openai, url: original}]
  - name: embeddings
    match: {path: /v1/embeddings}
    upstreams: [{name: openai, url: original}]
faults:
  - {route: nope, kind: reset}
"""
    name = tmp_path / "rules.yaml"
    assert error_of(tmp_path, text).splitlines() == [
        f"{name}:6: routes[0].upstreams[0].url: must be `original` or an http(s) URL, got 'ftp://x'",
        f"{name}:7: routes[0].upstreams[1].name: duplicate upstream name 'openai'",
        f"{name}:8: routes[1].name: duplicate route name 'chat'",
        f"{name}:11: routes[2].api: cannot infer the API from match.path; set api: openai-chat, openai-responses, "
        "anthropic-messages or google-gemini",
        f"{name}:15: faults[0].route: no route named 'nope'",
    ]


def test_a_key_that_is_not_a_plain_name_is_a_rules_error(tmp_path: Path) -> None:
    assert error_of(tmp_path, "version: 1\n? [a, b]\n: 1\n").endswith(
        ":2: (top level): a key must be a plain name, not a list or mapping")


@pytest.mark.parametrize("field", ["connect_timeout_s: true", "retries: yes", "staging_limit: on", "backoff_ms: false"])
def test_yaml_flags_are_not_numbers(tmp_path: Path, field: str) -> None:
    """pydantic reads `true` as 1: a timeout of `true` would silently be one second."""
    name, value = field.split(": ")
    message = error_of(tmp_path, MINIMAL + f"    {field}\n")
    assert message.endswith(f":8: routes[0].{name}: a number is needed here, not {'true' if value in ('true', 'yes', 'on') else 'false'}")


def test_an_unknown_key_far_from_any_known_one_gets_no_guess(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + "    colour: blue\n")
    assert message.endswith(":8: routes[0].colour: not a known key here")


def test_an_unclosed_flow_mapping_names_the_line_it_opened_on(tmp_path: Path) -> None:
    text = "version: 1\nroutes:\n  - name: chat\n    match: {path: /v1/chat/completions\n    upstreams: []\n"
    message = error_of(tmp_path, text)
    assert message.endswith(":5: invalid YAML: expected ',' or '}', but got ':' "
                            "(while parsing a flow mapping that starts on line 4)")


def test_a_route_an_earlier_one_always_takes_first_is_warned_about(tmp_path: Path) -> None:
    text = MINIMAL + """\
  - name: gpt4-only
    match: {host: api.openai.com, path: /v1/chat/completions, model: "gpt-4*"}
    upstreams: [{name: openai, url: original}]
  - name: responses-any-openai-host
    match: {host: "*.OpenAI.com", path: /v1/responses}
    upstreams: [{name: openai, url: original}]
  - name: responses-api-host
    match: {host: api.openai.com, path: /v1/responses}
    upstreams: [{name: openai, url: original}]
  - name: responses-some-host
    match: {host: "api*.openai.com", path: /v1/responses}
    upstreams: [{name: openai, url: original}]
"""
    rules = load_rules(write(tmp_path, text))
    name = tmp_path / "rules.yaml"
    assert rules.warnings == (
        f"{name}:8: route 'gpt4-only' is never used: route 'chat' (line 3) comes first and takes every request it would",
        f"{name}:14: route 'responses-api-host' is never used: route 'responses-any-openai-host' (line 11) comes first "
        "and takes every request it would",
    )  # a glob under a glob is not judged: only sure cases are warned about
    assert [route.name for route in rules.routes][-1] == "responses-some-host"


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read rules"):
        load_rules(tmp_path / "absent.yaml")


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 700) | st.text(max_size=12) | st.sampled_from(["original", "8MiB", "/v1/chat/completions", "http://x/v1/responses"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["version", "routes", "defaults", "faults", "name", "match", "path", "upstreams", "url", "retries", "api", "auth", "kind", "route", "x"]),
        children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(document=yaml_values)
def test_any_document_loads_or_fails_with_a_rules_error(tmp_path_factory: pytest.TempPathFactory, document: object) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "rules.yaml"
    path.write_text(yaml.safe_dump(document))
    try:
        load_rules(path)
    except RulesError as exc:
        assert str(exc).startswith(f"{path}:")


# --- settings that would load and then fail every request -----------------------------


@pytest.mark.parametrize("upstream, line, problem", [
    ('url: "https://backup.example.com:99999/v1/chat/completions"', 9,
     "routes[0].upstreams[1].url: its port must be a number from 1 to 65535, "
     "got 'https://backup.example.com:99999/v1/chat/completions'"),
    ('url: "https://:443/v1/chat/completions"', 9, "routes[0].upstreams[1].url: has no host"),
    ('url: "https://backup example.com/v1"', 9, "routes[0].upstreams[1].url: holds a space or a control character"),
    ('url: https://backup.example.com/v1/chat/completions\n        headers:\n          "X-Team:Name": dev', 11,
     "routes[0].upstreams[1].headers.X-Team:Name: 'X-Team:Name' is not a header name"),
    ('url: https://backup.example.com/v1/chat/completions\n        headers:\n          X-Team: "dev\\r\\nX-Injected: 1"', 11,
     "routes[0].upstreams[1].headers.X-Team: the value holds a line break or another control character"),
    ('url: https://backup.example.com/v1/chat/completions\n        headers:\n          X-Team: |\n            dev\n', 11,
     "routes[0].upstreams[1].headers.X-Team: the value holds a line break or another control character"),
    ('url: https://backup.example.com/v1/chat/completions\n        auth: {header: "Authorization ", value: "Bearer x"}',
     10, "routes[0].upstreams[1].auth.header: 'Authorization ' is not a header name"),
    ('url: https://backup.example.com/v1/chat/completions\n        auth: {header: Authorization, value: "Bearer\\0x"}',
     10, "routes[0].upstreams[1].auth.value: the value holds a line break or another control character"),
    ('url: https://backup.example.com/v1/chat/completions\n        forward_headers: [X-Auth-Token, "X Bad"]',
     10, "routes[0].upstreams[1].forward_headers[1]: 'X Bad' is not a header name"),
], ids=["port-99999", "no-host", "space-in-url", "colon-in-name", "crlf-in-value", "block-scalar-newline",
        "space-in-auth-header", "nul-in-auth-value", "bad-forward-header"])
def test_a_header_or_url_no_request_could_carry_is_refused_at_load_naming_file_line_and_field(
        tmp_path: Path, upstream: str, line: int, problem: str) -> None:
    path = write(tmp_path, MINIMAL + f"      - name: backup\n        {upstream}\n")
    with pytest.raises(RulesError) as caught:
        load_rules(path)
    assert str(caught.value).startswith(f"{path}:{line}: {problem}")


def test_forwarded_credential_names_are_read_per_upstream(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "      - name: backup\n        url: https://backup.example.com/v1/chat/completions\n"
                 "        forward_headers: [X-Auth-Token]\n        forward_query: [Subscription-Key]\n")
    backup = load_rules(path).routes[0].upstreams[1]
    assert backup.forward_headers == {"x-auth-token"} and backup.forward_query == {"subscription-key"}


# --- what a rules file may make the proxy do ------------------------------------------

LAUGHS = "".join(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9) if n else '1, 2, 3, 4, 5, 6, 7, 8, 9'}]\n"
                 for n in range(10))


@pytest.mark.parametrize("text, line, problem", [
    (MINIMAL + LAUGHS, 13, "invalid YAML: more than 100,000 values once its aliases are expanded"),
    (MINIMAL + "".join(f"a{n}: &a{n} 1\n" for n in range(101)) + "b: [" + ", ".join(f"*a{n}" for n in range(101)) + "]\n",
     109, "invalid YAML: more than 100 aliases (`*name`)"),
    ("version: 1\nroutes: " + "[" * 5000 + "]" * 5000 + "\n", 2, "invalid YAML: nested more than 50 levels deep"),
    ("version: 1\nroutes:\n" + "".join("  " * n + "- \n" for n in range(1, 80)), 52,
     "invalid YAML: nested more than 50 levels deep"),
    ("version: 1\nx: &x [1, *x]\n", 2, "invalid YAML: an alias inside the node it names"),
], ids=["billion-laughs", "many-aliases", "deep-flow", "deep-block", "recursive-alias"])
def test_a_hostile_rules_file_is_refused_at_once_with_its_line(tmp_path: Path, text: str, line: int,
                                                               problem: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RulesError) as caught:
        load_rules(path)
    assert str(caught.value) == f"{path}:{line}: {problem}"


def test_a_rules_file_over_a_mebibyte_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(MINIMAL + "# padding\n" * 120_000)
    with pytest.raises(RulesError) as caught:
        load_rules(path)
    assert str(caught.value) == f"{path}: the file is over 1024 KiB; rules are never that long"


def test_anchors_and_aliases_within_bounds_still_work(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        version: 1
        defaults: &base {retries: 2, backoff_ms: 10}
        routes:
          - name: chat
            match: {path: /v1/chat/completions}
            <<: *base
            upstreams:
              - &openai {name: openai, url: original}
          - name: chat2
            match: {path: /v2/chat/completions}
            api: openai-chat
            upstreams: [*openai]
        """)
    rules = load_rules(path)
    assert [route.settings.backoff_ms for route in rules.routes] == [10, 10]
    assert [route.upstreams[0].name for route in rules.routes] == ["openai", "openai"]


def test_what_variables_filled_in_is_kept_secret_but_a_host_is_not(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A host and port are shown wherever the upstream is; a key in the query, `auth` or a
    header is redacted in whatever comes back from that upstream."""
    monkeypatch.setenv("SWY_HOST", "backup.example.com")
    monkeypatch.setenv("SWY_QUERY_KEY", "sk-query-key-123456")
    monkeypatch.setenv("SWY_AUTH_KEY", "sk-auth-key-654321")
    path = write(tmp_path, MINIMAL + "      - name: backup\n"
                 '        url: "https://${SWY_HOST}/v1/chat/completions?key=${SWY_QUERY_KEY}"\n'
                 '        auth: {header: Authorization, value: "Bearer ${SWY_AUTH_KEY}"}\n')
    backup = load_rules(path).routes[0].upstreams[1]
    assert set(backup.env_values) == {"sk-query-key-123456", "sk-auth-key-654321"}


def test_continue_after_cut_and_prefill_keys_are_read(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, """\
        version: 1
        defaults:
          continue_after_cut: [prefill, regenerate]
        routes:
          - name: chat
            match: {path: /v1/chat/completions}
            upstreams:
              - name: openai
                url: original
              - name: vllm
                url: http://127.0.0.1:8000/v1/chat/completions
                prefill: true
                prefill_body: {continue_final_message: true, add_generation_prompt: false}
                prefill_message: {prefix: true}
          - name: plain
            match: {path: /v1/messages}
            continue_after_cut: []
            upstreams:
              - {name: anthropic, url: original}
        """))
    chat, plain = rules.routes
    assert chat.settings.continue_after_cut == ("prefill", "regenerate")
    assert plain.settings.continue_after_cut == ()
    openai, vllm = chat.upstreams
    assert (openai.prefill, dict(openai.prefill_body)) == (False, {})
    assert vllm.prefill and dict(vllm.prefill_body) == {"continue_final_message": True, "add_generation_prompt": False}
    assert dict(vllm.prefill_message) == {"prefix": True}


def test_continue_after_cut_is_off_unless_asked_for(tmp_path: Path) -> None:
    assert load_rules(write(tmp_path, MINIMAL)).routes[0].settings.continue_after_cut == ()


@pytest.mark.parametrize("extra,line,field,words", [
    ("    continue_after_cut: [prefill, replay]\n", 5, "routes[0].continue_after_cut[1]", "'prefill' or 'regenerate'"),
    ("    continue_after_cut: [regenerate, regenerate]\n", 5, "routes[0].continue_after_cut:", "more than once"),
    ("        prefill_body: {stream: false}\n", 8, "routes[0].upstreams[0].prefill_body", "stream cannot be set"),
    ("        prefill_message: {prefix: true}\n", 8, "routes[0].upstreams[0].prefill_message", "only with prefill: true"),
    ("        prefill: maybe\n", 8, "routes[0].upstreams[0].prefill", "boolean"),
    ("        prefill: true\n        prefill_message: {role: user}\n", 9, "routes[0].upstreams[0].prefill_message",
     "role cannot be set"),
    ("        prefill: true\n        prefill_message: {prefix: true, content: hi}\n", 9,
     "routes[0].upstreams[0].prefill_message", "content cannot be set"),
])
def test_continuation_keys_are_checked_with_file_line_and_field(tmp_path: Path, extra: str, line: int, field: str,
                                                               words: str) -> None:
    if extra.startswith("        "):
        text = MINIMAL + extra
    else:
        text = MINIMAL.replace("    upstreams:\n", extra + "    upstreams:\n")
    message = error_of(tmp_path, text)
    assert f"rules.yaml:{line}: {field}" in message and words in message, message


@pytest.mark.parametrize("path,prefill,warned", [
    ("/v1/chat/completions", False, "no upstream says prefill: true"),
    ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", False, "no upstream says prefill: true"),
    ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", True, None),
    ("/v1/responses", True, None),
    ("/v1/messages", True, None),
])
def test_a_prefill_strategy_that_can_never_run_is_warned_about(tmp_path: Path, path: str, prefill: bool,
                                                               warned: str | None) -> None:
    text = MINIMAL.replace("/v1/chat/completions", path).replace(
        "    upstreams:\n", "    continue_after_cut: [prefill, regenerate]\n    upstreams:\n")
    if prefill:
        text += "        prefill: true\n"
    rules = load_rules(write(tmp_path, text))
    assert rules.routes[0].settings.continue_after_cut == ("prefill", "regenerate")
    if warned is None:
        assert rules.warnings == ()
    else:
        assert rules.warnings == (f"{tmp_path / 'rules.yaml'}:3: route 'chat': continue_after_cut's prefill does "
                                  f"nothing here: {warned}",)


# --- outage memory and hedging: max_skip_s, unreachable_skip_s, hedge_after_s ------------

MEMORY_SETTINGS = ("max_skip_s", "unreachable_skip_s", "hedge_after_s")


def test_outage_memory_and_hedging_settings_default_to_a_capped_memory_and_no_hedge(tmp_path: Path) -> None:
    settings = load_rules(write(tmp_path, MINIMAL)).routes[0].settings
    assert (settings.max_skip_s, settings.unreachable_skip_s, settings.hedge_after_s) == (300, 10, 0)


def test_outage_memory_and_hedging_settings_are_set_in_defaults_and_a_route_overrides_them(tmp_path: Path) -> None:
    text = MINIMAL.replace("version: 1", "version: 1\ndefaults: {max_skip_s: 60, unreachable_skip_s: 0, hedge_after_s: 2.5}")
    text += """\
  - name: messages
    match: {path: /v1/messages}
    max_skip_s: 0
    unreachable_skip_s: 30
    hedge_after_s: 0
    upstreams: [{name: anthropic, url: original}]
"""
    chat, messages = load_rules(write(tmp_path, text)).routes
    assert (chat.settings.max_skip_s, chat.settings.unreachable_skip_s, chat.settings.hedge_after_s) == (60, 0, 2.5)
    assert (messages.settings.max_skip_s, messages.settings.unreachable_skip_s, messages.settings.hedge_after_s) == (0, 30, 0)


@pytest.mark.parametrize("name", MEMORY_SETTINGS)
@pytest.mark.parametrize("value, problem", [
    ("-1", "Input should be greater than or equal to 0"),
    ("-0.5", "Input should be greater than or equal to 0"),
    ("yes", "a number is needed here, not true"),
    ("off", "a number is needed here, not false"),
    ("soon", "Input should be a valid number, unable to parse string as a number"),
    ("[10]", "Input should be a valid number"),
])
def test_a_bad_memory_or_hedging_setting_on_a_route_is_refused_naming_file_line_and_field(
        tmp_path: Path, name: str, value: str, problem: str) -> None:
    assert error_of(tmp_path, MINIMAL + f"    {name}: {value}\n") == f"{tmp_path / 'rules.yaml'}:8: routes[0].{name}: {problem}"


@pytest.mark.parametrize("name", MEMORY_SETTINGS)
def test_a_bad_memory_or_hedging_setting_in_defaults_is_refused_naming_file_line_and_field(tmp_path: Path, name: str) -> None:
    text = MINIMAL.replace("version: 1", f"version: 1\ndefaults:\n  retries: 1\n  {name}: -3")
    assert error_of(tmp_path, text) == f"{tmp_path / 'rules.yaml'}:4: defaults.{name}: Input should be greater than or equal to 0"


@pytest.mark.parametrize("name", MEMORY_SETTINGS)
def test_a_memory_or_hedging_setting_is_not_an_upstream_key(tmp_path: Path, name: str) -> None:
    """They are a route's: memory and hedging decide between upstreams, not within one."""
    message = error_of(tmp_path, MINIMAL.replace("url: original", f"url: original\n        {name}: 5"))
    assert message.startswith(f"{tmp_path / 'rules.yaml'}:8: routes[0].upstreams[0].{name}: not a known key here")


def test_the_outages_docs_rules_load_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "outages.md").read_text()
    text = docs.split("```yaml\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("BACKUP_API_KEY", "sk-backup")
    rules = load_rules(write(tmp_path, text))
    route = rules.routes[0]
    assert [u.name for u in route.upstreams] == ["openai", "backup"] and rules.warnings == ()
    assert (route.settings.max_skip_s, route.settings.unreachable_skip_s, route.settings.hedge_after_s) == (300, 30, 0)
    hedging = docs.split("## Hedging", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    hedged = load_rules(write(tmp_path, hedging)).routes[0]
    assert hedged.settings.hedge_after_s == 4 and [u.name for u in hedged.upstreams] == ["openai", "backup"]
