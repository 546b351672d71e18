"""Every recipe in docs/clients.md, run as it is written there (tests/support/recipes.py
reads each block out of the doc): the client's first answer is an overload before any
output, which Switchyard retries, and the client prints the primary's answer having
asked once.  Without Switchyard the same failure ends the client, as the doc says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import wire
from tests.support.recipes import DocsBed, docs_bed, recipe, recipe_bed  # noqa: F401  (fixtures)

DOC = "docs/clients.md"
PRIMARY = wire.answer_text("primary")


def ran(done) -> str:  # noqa: ANN001
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip()


def retried_by_switchyard(bed: DocsBed, mark: int) -> None:
    """Two requests at the primary (the overload and Switchyard's retry), none at the backup,
    and the retry in Switchyard's log."""
    assert len(bed.posts("primary")) == 2 and not bed.posts("backup")
    bed.mitm.wait_for_log("switchyard.retry_answered route=", mark)


def sdk_recipe(bed: DocsBed, sdk: str, mode: str, kind: str) -> None:
    bed.fail(kind)
    mark = bed.mitm.log_mark()
    home = bed.home(f"{sdk}-{mode}")
    (home / "my_agent.py").write_text(recipe(DOC, f"{sdk}-python").text)
    assert ran(bed.run(bed.as_run(recipe(DOC, f"{sdk}-{mode}").text), home)) == PRIMARY
    retried_by_switchyard(bed, mark)


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_openai_sdk_recipe(recipe_bed: DocsBed, mode: str) -> None:
    sdk_recipe(recipe_bed, "openai-sdk", mode, "sse_503")


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_anthropic_sdk_recipe(recipe_bed: DocsBed, mode: str) -> None:
    sdk_recipe(recipe_bed, "anthropic-sdk", mode, "sse_529")


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_google_genai_recipe(recipe_bed: DocsBed, mode: str) -> None:
    sdk_recipe(recipe_bed, "google-genai", mode, "sse_503")


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_curl_recipe(recipe_bed: DocsBed, mode: str) -> None:
    recipe_bed.fail("sse_503")
    mark = recipe_bed.mitm.log_mark()
    body = ran(recipe_bed.run(recipe_bed.as_run(recipe(DOC, f"curl-{mode}").text), recipe_bed.home(f"curl-{mode}")))
    assert body.encode() + b"\n\n" == b"".join(wire.chat_stream(PRIMARY))
    retried_by_switchyard(recipe_bed, mark)


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_llm_recipe_sets_the_key_and_gets_the_answer(recipe_bed: DocsBed, mode: str) -> None:
    recipe_bed.fail("sse_503")
    mark = recipe_bed.mitm.log_mark()
    assert ran(recipe_bed.run(recipe_bed.as_run(recipe(DOC, f"llm-{mode}").text), recipe_bed.home(f"llm-{mode}"))) == (
        PRIMARY)
    retried_by_switchyard(recipe_bed, mark)


def test_without_switchyard_llm_ends_with_the_overload(recipe_bed: DocsBed) -> None:
    recipe_bed.fail("sse_503")
    done = recipe_bed.run(recipe_bed.as_run(recipe(DOC, "llm-reverse").text, straight=True),
                          recipe_bed.home("llm-straight"))
    assert done.returncode == 1 and "Error: provider overloaded" in done.stderr
    assert len(recipe_bed.posts("primary")) == 1


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_codex_recipe_with_its_provider_over_http_sse(recipe_bed: DocsBed, mode: str) -> None:
    recipe_bed.fail("response_failed")
    mark = recipe_bed.mitm.log_mark()
    home = recipe_bed.home(f"codex-{mode}")
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(recipe_bed.as_run(recipe(DOC, f"codex-config-{mode}").text))
    assert PRIMARY in ran(recipe_bed.run(recipe_bed.as_run(recipe(DOC, f"codex-{mode}").text), home))
    retried_by_switchyard(recipe_bed, mark)


def test_the_codex_websocket_recipe(recipe_bed: DocsBed) -> None:
    """The fake provider refuses the upgrade (405), as an HTTP-only upstream does: Switchyard
    asks it over HTTP SSE, and Codex's WebSocket turn gets the answer after the retry."""
    recipe_bed.fail("response_failed")
    mark = recipe_bed.mitm.log_mark()
    out = ran(recipe_bed.run(recipe_bed.as_run(recipe(DOC, "codex-websocket").text), recipe_bed.home("codex-ws")))
    assert out == PRIMARY
    retried_by_switchyard(recipe_bed, mark)
    assert "transport=websocket" in recipe_bed.mitm.log_since(mark)


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_claude_code_recipe(recipe_bed: DocsBed, mode: str) -> None:
    recipe_bed.fail("sse_529")
    mark = recipe_bed.mitm.log_mark()
    home = recipe_bed.home(f"claude-{mode}")
    assert ran(recipe_bed.run(recipe_bed.as_run(recipe(DOC, f"claude-{mode}").text), home)) == PRIMARY
    retried_by_switchyard(recipe_bed, mark)


def gemini_home(bed: DocsBed, name: str, settings: bool = True) -> Path:
    home = bed.home(name)
    if settings:
        (home / ".gemini").mkdir()
        (home / ".gemini" / "settings.json").write_text(recipe(DOC, "gemini-cli-settings").text)
    return home


def test_the_gemini_cli_recipe_both_steps(recipe_bed: DocsBed) -> None:
    recipe_bed.fail("sse_503")
    mark = recipe_bed.mitm.log_mark()
    assert json.loads(recipe(DOC, "gemini-cli-settings").text) == {"security": {"auth": {"selectedType":
                                                                                        "gemini-api-key"}}}
    out = ran(recipe_bed.run(recipe_bed.as_run(recipe(DOC, "gemini-cli-reverse").text), gemini_home(recipe_bed, "gm")))
    assert out == PRIMARY
    retried_by_switchyard(recipe_bed, mark)


def test_gemini_cli_without_either_step_stops_as_the_doc_says(recipe_bed: DocsBed) -> None:
    command = recipe_bed.as_run(recipe(DOC, "gemini-cli-reverse").text)
    no_settings = recipe_bed.run(command, gemini_home(recipe_bed, "gm-no-settings", settings=False))
    assert no_settings.returncode == 41 and "Invalid auth method selected." in no_settings.stdout + no_settings.stderr
    untrusted = recipe_bed.run(command.replace(" --skip-trust", ""), gemini_home(recipe_bed, "gm-untrusted"))
    assert untrusted.returncode == 55, untrusted.stdout[-2000:] + untrusted.stderr[-2000:]
    assert "Gemini CLI is not running in a trusted directory" in untrusted.stdout + untrusted.stderr
    assert not recipe_bed.posts("primary")


def test_gemini_cli_on_its_own_reports_a_failed_stream_and_exits_0(recipe_bed: DocsBed) -> None:
    """What the doc says it shows without Switchyard, when an in-stream 503 persists."""
    recipe_bed.fail("sse_503", -1)  # always
    done = recipe_bed.run(recipe_bed.as_run(recipe(DOC, "gemini-cli-reverse").text, straight=True),
                          gemini_home(recipe_bed, "gm-straight"))
    assert done.returncode == 0
    assert "[ERROR] Model stream ended without a finish reason." in done.stdout + done.stderr
    assert PRIMARY not in done.stdout and len(recipe_bed.posts("primary")) > 1  # its own retries, in vain


def test_a_client_that_does_not_trust_the_ca_fails_as_the_doc_says(recipe_bed: DocsBed) -> None:
    """The troubleshooting note: curl's proxy recipe without --cacert fails its handshake,
    mitmproxy logs the lines the doc shows, and nothing reaches Switchyard or the provider."""
    doc = (Path(__file__).resolve().parents[1] / DOC).read_text()
    text = recipe_bed.as_run(recipe(DOC, "curl-proxy").text).replace("--cacert ~/.mitmproxy/mitmproxy-ca-cert.pem ", "")
    mark = recipe_bed.mitm.log_mark()
    done = recipe_bed.run(text, recipe_bed.home("curl-untrusted"))
    assert done.returncode == 60 and "curl: (60) SSL certificate problem: unable to get local issuer certificate" in (
        done.stderr) and "curl: (60) SSL certificate problem: unable to get local issuer certificate" in doc
    logged = recipe_bed.mitm.wait_for_log("Client TLS handshake failed", mark)
    said = ("Client TLS handshake failed. The client does not trust the proxy's certificate for {host} "
            "(tlsv1 alert unknown ca)")
    assert said.format(host="api.openai.com") in logged and said.format(host="api.anthropic.com") in doc
    assert "switchyard." not in logged and not recipe_bed.posts("primary")


MODES = ("reverse", "proxy")
RUN_HERE = {  # what the tests above run, by name
    *(f"{sdk}-{part}" for sdk in ("openai-sdk", "anthropic-sdk", "google-genai") for part in ("python", *MODES)),
    *(f"{client}-{mode}" for client in ("curl", "llm", "codex-config", "codex", "claude") for mode in MODES),
    "codex-websocket", "gemini-cli-settings", "gemini-cli-reverse",
}
RUN_ELSEWHERE = {"README.md": {"try-stall": "tests/test_try.py"}}


def test_every_recipe_in_the_docs_is_run_by_a_test() -> None:
    from tests.support.recipes import ROOT, recipes

    assert set(recipes(DOC)) == RUN_HERE
    for doc in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        relative = str(doc.relative_to(ROOT))
        if relative != DOC:
            assert set(recipes(relative)) == set(RUN_ELSEWHERE.get(relative, {})), relative
    for doc, where in RUN_ELSEWHERE.items():
        for name, test_file in where.items():
            assert f'recipe("{doc}", "{name}")' in (ROOT / test_file).read_text(), (doc, name)
