"""`switchyard.status`: what the proxy runs on and what it has seen, as text."""

from __future__ import annotations

from collections import Counter

from ..relay import Relay
from .rules_keeper import RulesKeeper


def status_text(keeper: RulesKeeper, counters: Counter[str], relay_: Relay | None, now: float) -> str:
    """Routes, upstreams (with whether their credentials are present), the upstreams being
    skipped and until when, faults, counters, the relay."""
    rules = keeper.rules
    lines = [f"rules: {rules.source if rules else '(none loaded)'}"]
    for route in rules.routes if rules else ():
        strategies = route.settings.continue_after_cut
        lines.append(f"route {route.name} ({route.api})"
                     + (f"; continue_after_cut={','.join(strategies)}" if strategies else ""))
        for upstream in route.upstreams:
            where = "original destination" if upstream.is_original else upstream.display_url
            auth = "own auth set" if upstream.auth else ("client's credentials" if upstream.is_original else "no auth")
            lines.append(f"  upstream {upstream.name}: {where}; {auth}; retries={upstream.retries}"
                         + (f"; speaks {upstream.api}, model {upstream.model}" if upstream.api else "")
                         + ("; prefill" if upstream.prefill else ""))
    for warning in rules.warnings if rules else ():
        lines.append(f"warning: {warning}")
    if keeper.faults is not None:
        lines.extend(f"fault: {line}" for line in keeper.faults.describe())
    lines.extend(f"skipped: {line}" for line in keeper.outages.status(now))
    counts = ", ".join(f"{k}={counters[k]}" for k in ("routed", "attempts", "failed_attempts", "retries_answered",
                                                         "fallbacks", "suppressed_failovers",
                                                         "continued_after_cut", "continuations_failed",
                                                         "skipped", "hedged", "hedges_won"))
    lines.append(f"counters: {counts}")
    if relay_ is not None:
        relay = relay_
        lines.append(f"relay: 127.0.0.1:{relay.port}, in flight={relay.in_flight}, unused tokens={relay.pending}, "
                     f"answers={relay.answers} (in-process={relay.direct_answers}, "
                     f"straight to the client={relay.client_answers})")
        ws = relay.websocket
        lines.append("websocket: " + ", ".join(f"{k}={ws['websocket_' + k]}" for k in (
            "connections", "turns", "retries_answered", "fallbacks", "suppressed_failovers",
            "continued_after_cut", "continuations_failed")))
    return "\n".join(lines)
