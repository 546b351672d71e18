"""Read `rules.yaml` into runtime routes, with errors that name file, line and field
(found by locations.py).

`${VAR}` is expanded only in an upstream's `url`, `auth.value` and `headers`
values, the places secrets belong; an upstream whose variable is unset is
skipped with one warning.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from pydantic import ValidationError

from ..apis import api_for_path
from ..continuation.request import PREFILL_APIS
from .locations import RULES_SIZE_LIMIT, RulesError, compose_with_lines, field_problem, line_of, validation_problems
from .schema import FaultSpec, RulesFile, Settings, UpstreamSpec, default_of

SHIPPED_RULES = Path(__file__).resolve().parents[3] / "rules.yaml"

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token: what a header name may be
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # never in a header value (a tab may be)


# Each setting's default is written once, in schema.py (`setting(...)`), as in rules.yaml,
# and parsed by the same schema as a user's file.
_DEFAULTS = Settings.model_validate({name: default_of(Settings, name) for name in Settings.model_fields})


def _runtime(name: str, value: Any) -> Any:
    """A setting's validated value as AttemptSettings holds it (lists frozen)."""
    return frozenset(value) if name == "retry_on" else tuple(value) if isinstance(value, list) else value


def _default(name: str) -> Any:
    return _runtime(name, getattr(_DEFAULTS, name))


@dataclass(frozen=True, slots=True)
class AttemptSettings:
    """A route's settings, resolved: the defaults (schema.py's), `defaults:` over them, the route's over those."""

    retries: int = _default("retries")
    backoff_ms: int = _default("backoff_ms")
    max_backoff_ms: int = _default("max_backoff_ms")
    connect_timeout_s: float = _default("connect_timeout_s")
    headers_timeout_s: float = _default("headers_timeout_s")
    first_output_timeout_s: float = _default("first_output_timeout_s")
    request_timeout_s: float = _default("request_timeout_s")
    idle_timeout_s: float = _default("idle_timeout_s")
    pre_answer_keepalive_s: float = _default("pre_answer_keepalive_s")
    staging_limit: int = _default("staging_limit")
    rewrite_capacity_codes: bool = _default("rewrite_capacity_codes")
    retry_on: frozenset[int] = _default("retry_on")
    continue_after_cut: tuple[str, ...] = _default("continue_after_cut")  # strategies, in order; () keeps a cut a clean error
    max_skip_s: float = _default("max_skip_s")  # the cap on a stated delay later requests honour (attempts/outages.py)
    unreachable_skip_s: float = _default("unreachable_skip_s")  # an unreachable upstream is skipped this long; 0 off
    hedge_after_s: float = _default("hedge_after_s")  # no output by then: the next upstream starts too; 0 off

    def overlay(self, spec: Settings) -> "AttemptSettings":
        """These settings with those `spec` sets (a route's over the defaults)."""
        changes: dict[str, Any] = {}
        for name in Settings.model_fields:
            value = getattr(spec, name)
            if value is not None:
                changes[name] = _runtime(name, value)
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    url: str | None  # None: the request's own destination
    model: str | None
    retries: int
    auth: tuple[str, str] | None
    headers: tuple[tuple[str, str], ...]
    display_url: str | None = None  # `url` as written, `${VAR}` unexpanded: safe to show
    secret_headers: frozenset[str] = frozenset()  # lowercased names whose values came from the environment
    env_values: tuple[str, ...] = ()  # what `${VAR}`s were filled with: never shown, never passed on
    forward_headers: frozenset[str] = frozenset()  # lowercased: the client's, sent although they look like credentials
    forward_query: frozenset[str] = frozenset()
    prefill: bool = False  # continues a conversation that ends in an assistant message
    # merged into a prefill request's top level, and into its final assistant message
    prefill_body: Mapping[str, Any] = field(default_factory=dict, hash=False)
    prefill_message: Mapping[str, Any] = field(default_factory=dict, hash=False)
    websocket: bool | None = None  # Responses turns over WebSocket: None tries the upgrade, False never does
    api: str | None = None  # the API it speaks, where it is not its route's (its answers are translated)

    @property
    def is_original(self) -> bool:
        return self.url is None


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    api: str
    upstreams: tuple[Upstream, ...]
    settings: AttemptSettings
    host: str | None = None
    path: str | None = None
    model: str | None = None

    def matches(self, host: str, path: str, model: Callable[[], str | None]) -> bool:
        if self.host is not None and not fnmatchcase(host.lower(), self.host.lower()):
            return False
        if self.path is not None and not fnmatchcase(path, self.path):
            return False
        if self.model is not None:
            wanted = model()
            if wanted is None or not fnmatchcase(wanted, self.model):
                return False
        return True


@dataclass(frozen=True, slots=True)
class Rules:
    source: Path
    routes: tuple[Route, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    def route_for(self, host: str, path: str, model: Callable[[], str | None]) -> Route | None:
        path = path.split("?", 1)[0]
        for route in self.routes:
            if route.matches(host, path, model):
                return route
        return None


def default_rules_path(cwd: Path | None = None) -> Path:
    local = (cwd or Path.cwd()) / "rules.yaml"
    return local if local.is_file() else SHIPPED_RULES


# --- resolution -------------------------------------------------------------


def _expand(text: str, missing: set[str], broken: set[str], filled: list[tuple[str, str]] | None = None) -> str:
    def sub(found: re.Match[str]) -> str:
        value = os.environ.get(found.group(1))
        if value is None or value == "":
            missing.add(found.group(1))
            return ""
        if _CONTROL.search(value):
            broken.add(found.group(1))  # would split a header: never sent
            return ""
        if filled is not None:
            filled.append((found.group(1), value))
        return value

    return _VAR.sub(sub, text)


def _resolve_upstream(
    spec: UpstreamSpec, route_retries: int, where: str, warnings: list[str]
) -> Upstream | None:
    missing: set[str] = set()
    broken: set[str] = set()
    filled: list[tuple[str, str]] = []
    url = None if spec.url == "original" else _expand(spec.url, missing, broken, filled)
    auth = (spec.auth.header, _expand(spec.auth.value, missing, broken, filled)) if spec.auth else None
    headers = tuple((name, _expand(value, missing, broken, filled)) for name, value in spec.headers.items())
    if missing:
        names = ", ".join(f"${{{name}}}" for name in sorted(missing))
        warnings.append(f"{where}: upstream {spec.name!r} skipped: {names} is not set")
        return None
    if broken:
        names = ", ".join(f"${{{name}}}" for name in sorted(broken))
        warnings.append(f"{where}: upstream {spec.name!r} skipped: {names} holds a line break or another "
                        "control character (a key read from a file with its newline?)")
        return None
    if url is not None and "${" in spec.url and _http_url_problem(url) is not None:
        # checked as written at load time only where it held no variable
        names = ", ".join(sorted(f"${{{name}}}" for name in set(_VAR.findall(spec.url))))
        warnings.append(f"{where}: upstream {spec.name!r} skipped: its url with {names} expanded is not "
                        "an http(s) URL")  # the value itself is not shown: it may be a secret put there by mistake
        return None
    secret = {name.lower() for name, value in spec.headers.items() if _VAR.search(value)}
    # a host and port are shown wherever the upstream is (mitmweb's destination): not secrets
    written = urlsplit(spec.url)
    elsewhere = " ".join([written.path, written.query, spec.auth.value if spec.auth else "", *spec.headers.values()])
    in_host = set(_VAR.findall(written.netloc)) - set(_VAR.findall(elsewhere))
    if spec.auth is not None:
        secret.add(spec.auth.header.lower())
    return Upstream(
        name=spec.name,
        url=url,
        model=spec.model,
        retries=spec.retries if spec.retries is not None else route_retries,
        auth=auth,
        headers=headers,
        display_url=None if spec.url == "original" else spec.url,
        secret_headers=frozenset(secret),
        env_values=tuple(sorted({value for name, value in filled if name not in in_host}, key=len, reverse=True)),
        forward_headers=frozenset(name.lower() for name in spec.forward_headers),
        forward_query=frozenset(name.lower() for name in spec.forward_query),
        prefill=spec.prefill,
        prefill_body=MappingProxyType(dict(spec.prefill_body or {})),
        prefill_message=MappingProxyType(dict(spec.prefill_message or {})),
        websocket=None if spec.websocket == "auto" else bool(spec.websocket),
        api=spec.api,
    )


def _takes_all_of(earlier: Route, later: Route) -> bool:
    """Whether `earlier` matches every request `later` would (the first match wins, so
    `later` is dead).  Only sure cases: a glob against a glob counts when they are equal."""
    for mine, theirs, fold in ((earlier.host, later.host, True), (earlier.path, later.path, False),
                               (earlier.model, later.model, False)):
        if mine is None:
            continue
        if theirs is None:
            return False
        if fold:
            mine, theirs = mine.lower(), theirs.lower()
        if mine != theirs and (any(c in theirs for c in "*?[") or not fnmatchcase(theirs, mine)):
            return False
    return True


def _http_url_problem(url: str) -> str | None:
    """What keeps `url` from being an upstream's URL, if anything: found at load, not
    by every request failing later."""
    if re.match(r"^https?://[^/\s]+", url, re.IGNORECASE) is None:
        return "must be `original` or an http(s) URL"
    if re.search(r"[\x00-\x20\x7f]", url):
        return "holds a space or a control character"
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return "its port must be a number from 1 to 65535"
    if port == 0:
        return "its port must be a number from 1 to 65535"
    if not parts.hostname:
        return "has no host"
    return None


def _idle_prefill(api: str, strategies: tuple[str, ...], upstreams: list[Upstream]) -> str | None:
    """Why a route's `prefill` strategy can never run, if it cannot."""
    if "prefill" not in strategies:
        return None
    if api not in PREFILL_APIS:
        return f"{api} has no prefill"
    if not any(upstream.prefill for upstream in upstreams):
        return "no upstream says prefill: true"
    return None


def _url_problem(url: str) -> str | None:
    if url == "original" or "${" in url:
        return None  # one with a variable is checked once expanded
    problem = _http_url_problem(url)
    return None if problem is None else f"{problem}, got {url!r}"


def _header_problems(spec: UpstreamSpec, loc: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], str]]:
    """Header names and values that no request could carry: refused at load, with
    where they are, rather than every request to that upstream failing."""
    found: list[tuple[tuple[Any, ...], str]] = []

    def name_problem(name: str, where: tuple[Any, ...]) -> None:
        if _TOKEN.fullmatch(name) is None:
            found.append((where, f"{name!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~ only; "
                                 "no spaces or colons)"))

    def value_problem(value: str, where: tuple[Any, ...]) -> None:
        if _CONTROL.search(value):
            found.append((where, "the value holds a line break or another control character"))

    if spec.auth is not None:
        name_problem(spec.auth.header, loc + ("auth", "header"))
        value_problem(spec.auth.value, loc + ("auth", "value"))
    for name, value in spec.headers.items():
        name_problem(name, loc + ("headers", name))
        value_problem(value, loc + ("headers", name))
    for index, name in enumerate(spec.forward_headers):
        name_problem(name, loc + ("forward_headers", index))
    return found


def load_rules(path: Path) -> Rules:
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(RULES_SIZE_LIMIT + 1)  # a larger file is refused, never read whole
        text = raw.decode("utf-8")
    except OSError as exc:
        raise RulesError(f"{path}: cannot read rules: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RulesError(f"{path}: not UTF-8 text: {exc}") from None
    data, lines = compose_with_lines(path, text)
    try:
        parsed = RulesFile.model_validate(data)
    except ValidationError as exc:
        raise RulesError(validation_problems(path, exc, lines)) from None

    problems: list[tuple[int, str]] = []  # all of them at once, like the schema's

    def problem(loc: tuple[Any, ...], message: str) -> None:
        problems.append((line_of(loc, lines), field_problem(path, lines, loc, message)))

    defaults = AttemptSettings().overlay(parsed.defaults)
    warnings: list[str] = []
    routes: list[Route] = []
    seen_routes: set[str] = set()
    for r_index, spec in enumerate(parsed.routes):
        base = ("routes", r_index)
        if spec.name in seen_routes:
            problem(base + ("name",), f"duplicate route name {spec.name!r}")
            continue
        seen_routes.add(spec.name)
        api = spec.api or (api_for_path(spec.match.path) if spec.match.path else None)
        if api is None:
            problem(base + ("api",), "cannot infer the API from match.path; set api: openai-chat, openai-responses, "
                                     "anthropic-messages or google-gemini")
        settings = defaults.overlay(spec)
        seen_upstreams: set[str] = set()
        upstreams: list[Upstream] = []
        for u_index, upstream_spec in enumerate(spec.upstreams):
            u_loc = base + ("upstreams", u_index)
            if upstream_spec.name in seen_upstreams:
                problem(u_loc + ("name",), f"duplicate upstream name {upstream_spec.name!r}")
                continue
            seen_upstreams.add(upstream_spec.name)
            for key in ("prefill_body", "prefill_message"):
                if getattr(upstream_spec, key) is not None and not upstream_spec.prefill:
                    problem(u_loc + (key,), f"{key} is used only with prefill: true")
            url_problem = _url_problem(upstream_spec.url)
            if url_problem is not None:
                problem(u_loc + ("url",), url_problem)
                continue
            header_problems = _header_problems(upstream_spec, u_loc)
            for loc, message in header_problems:
                problem(loc, message)
            if header_problems:
                continue
            where = f"{path}:{line_of(u_loc, lines)}"
            if api is not None and upstream_spec.api not in (None, api) and upstream_spec.model is None:
                problem(u_loc + ("api",), f"an upstream that speaks {upstream_spec.api} on a {api} route needs "
                                          "`model:` (the client's model means nothing there)")
                continue
            resolved = _resolve_upstream(upstream_spec, settings.retries, where, warnings)
            if resolved is not None and resolved.api == api:
                resolved = replace(resolved, api=None)  # its route's own: nothing to translate
            if resolved is not None:
                upstreams.append(resolved)
        if api is None:
            continue
        if not upstreams:
            warnings.append(f"{path}:{line_of(base, lines)}: route {spec.name!r} disabled: no usable upstream")
            continue
        idle = _idle_prefill(api, settings.continue_after_cut, upstreams)
        if idle:
            warnings.append(f"{path}:{line_of(base, lines)}: route {spec.name!r}: continue_after_cut's prefill "
                            f"does nothing here: {idle}")
        routes.append(
            Route(
                name=spec.name,
                api=api,
                upstreams=tuple(upstreams),
                settings=settings,
                host=spec.match.host,
                path=spec.match.path,
                model=spec.match.model,
            )
        )
    route_lines = {spec.name: line_of(("routes", index), lines) for index, spec in enumerate(parsed.routes)}
    for later_index, later in enumerate(routes):
        for earlier in routes[:later_index]:
            if _takes_all_of(earlier, later):
                warnings.append(f"{path}:{route_lines[later.name]}: route {later.name!r} is never used: route "
                                f"{earlier.name!r} (line {route_lines[earlier.name]}) comes first and takes "
                                "every request it would")
                break
    route_upstreams = {spec.name: {u.name for u in spec.upstreams} for spec in parsed.routes}
    for f_index, fault in enumerate(parsed.faults):
        loc = ("faults", f_index)
        if fault.route not in route_upstreams:
            problem(loc + ("route",), f"no route named {fault.route!r}")
        elif fault.upstream is not None and fault.upstream not in route_upstreams[fault.route]:
            problem(loc + ("upstream",), f"route {fault.route!r} has no upstream named {fault.upstream!r}")
    if problems:
        raise RulesError("\n".join(text for _, text in sorted(problems, key=lambda found: found[0])))
    return Rules(source=path, routes=tuple(routes), faults=tuple(parsed.faults), warnings=tuple(warnings))
