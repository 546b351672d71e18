"""An HTTP attempt: one upstream answer read as the core needs it.

Its phases, in the order an answer can take them: `connect` (no head yet);
then, by the head, `error` (a non-2xx body, read whole within bounds), `whole`
(a non-streaming 2xx body, read whole, then checked for an error object) or
`staging` (a stream, through the gate: held until its first output); once
committed, `output`.  Two phases pass bytes on as they come: `forwarding` (the
last possible attempt's failure, as the provider sent it) and `rest` (a whole
answer too large to hold, committed and passed through).  A failure, a commit
or a cut is told to the core, which decides what follows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .. import observe
from ..apis import APIS, Api, Classification, ErrorInfo
from ..apis.errors import http_error_info
from ..exchange import AttemptRecord
from ..gate import SAID_NOTHING, Gate
from ..redaction import redact_bytes
from ..sse import compact_json
from ..translate.streams import StreamTranslator, error_body, error_status, stream_translator, translate_whole
from ..upstreams.messages import forwarded_response_headers, request_id, transport_failure
from .attempt import Attempt, Core
from .commands import Expect, Pipe, Read
from .endings import Answered

ERROR_BODY_LIMIT = 1024 * 1024
WHOLE_BODY_MIN_LIMIT = 64 * 1024 * 1024  # non-streaming answers are held whole up to max(this, staging_limit)

Phase = Literal["connect", "error", "whole", "staging", "output", "forwarding", "rest"]
NOT_A_STREAM = "switchyard: the upstream answered a streaming request with a non-streaming body"


def in_client_shape(client_api: str, info: ErrorInfo, record: AttemptRecord) -> Answered:
    """A translated upstream's failure (or Switchyard's reason not to ask it), as the
    client's API says it: its status, its body."""
    return Answered(error_status(client_api, info), [("Content-Type", "application/json")],
                    error_body(client_api, info), record)


def is_event_stream(headers: Mapping[str, str]) -> bool:
    return "text/event-stream" in headers.get("Content-Type", "").lower()


@dataclass(slots=True, eq=False)
class HttpAttempt(Attempt):
    phase: Phase = "connect"
    status: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    gate: Gate | None = None
    # an upstream that speaks another API than the client (docs/translation.md): its answer is
    # read by its own API and written in the client's
    speaks: str | None = None
    translator: StreamTranslator | None = None

    def _own_api(self, core: Core) -> Api:
        return APIS[self.speaks] if self.speaks is not None else core.api

    # --- the head -----------------------------------------------------------------------

    def opened(self, core: Core, status: int, headers: Mapping[str, str], now: float) -> None:
        self.status, self.headers = status, headers
        self.record.answered(status, request_id(headers), now)
        number = self.number
        if not 200 <= status < 300:
            self.phase = "error"
            core.out(Read(number, "error", ERROR_BODY_LIMIT, span_s=self.deadlines.error_body))
        elif is_event_stream(headers):
            self.phase = "staging"
            self.record.reached("staging")
            settings = core.settings
            wants_usage = core.exchange.request.wants_usage
            if self.speaks is not None:
                self.translator = stream_translator(self.speaks, core.api.name, model=self.upstream.model or "",
                                                    usage_wanted=wants_usage)
                wants_usage = self.speaks == "openai-chat"  # a translated Chat request always asks for usage
            self.gate = Gate(self._own_api(core).stream_classifier(wants_usage),
                             staging_limit=settings.staging_limit,
                             rewrite_capacity_codes=settings.rewrite_capacity_codes, translator=self.translator)
            # nothing before output moves this: an upstream sending `: ping` forever must not hold the request
            core.out(Expect(number, by=self.deadlines.staged_by), Pipe(number))
        else:
            self.phase = "whole"
            self.record.reached("body")
            limit = max(core.settings.staging_limit, WHOLE_BODY_MIN_LIMIT)
            core.out(Read(number, "whole", limit, by=self.deadlines.whole_by))

    def head_for_client(self) -> tuple[int, Mapping[str, str]]:
        return self.status, self.headers

    # --- bodies read whole ----------------------------------------------------------------

    def body_read(self, core: Core, body: bytes, complete: bool, error: BaseException | None, timed_out: bool,
                  now: float) -> None:
        if self.phase == "error":
            self._error_body(core, body, complete, now)
        else:
            self._whole_body(core, body, complete, error, timed_out, now)

    def _error_body(self, core: Core, body: bytes, complete: bool, now: float) -> None:
        body = redact_bytes(body, self.secrets)
        info = http_error_info(self.status, body)
        answered = core.end.keep(self.record, self.status, self.headers, body, complete=complete)
        if self.speaks is not None:
            answered = self._in_client_shape(core, answered, info)

        def forward() -> None:
            core.end.forward(answered, info)
            core.finish()

        core.failed(self, info, now, headers=self.headers, forward=forward)

    def _whole_body(self, core: Core, body: bytes, complete: bool, error: BaseException | None, timed_out: bool,
                    now: float) -> None:
        if timed_out:
            self._show(core, body)
            core.failed(self, self.deadlines.incomplete(), now, timed_out=True)
            return
        if error is not None:
            self._show(core, body)
            core.failed(self, transport_failure(error), now)
            return
        if not complete:  # too large to hold and check: committed, and the rest passed through
            if self._commit_whole(core, "body_limit"):
                return
            core.client.start(self.status, forwarded_response_headers(self.headers), self.upstream.name)
            core.client.write(body)
            self.phase = "rest"
            core.out(Expect(self.number, quiet=self.deadlines.quiet_after_output), Pipe(self.number))
            return
        body = redact_bytes(body, self.secrets)
        body_error: ErrorInfo | None = None
        parsed: object = None
        if "json" in self.headers.get("Content-Type", "").lower():
            try:
                parsed = json.loads(body)
                body_error = self._own_api(core).body_error(parsed)
            except (ValueError, RecursionError):
                body_error = None
        if body_error is not None:
            answered = core.end.keep(self.record, self.status, self.headers, body)
            if self.speaks is not None:
                answered = self._in_client_shape(core, answered, body_error)
            found = body_error

            def forward() -> None:
                core.end.forward(answered, found)
                core.finish()

            core.failed(self, body_error, now, headers=self.headers, forward=forward)
            return
        if self.speaks is not None:
            if not isinstance(parsed, dict | list):
                core.failed(self, ErrorInfo(status=502, message="the upstream's answer is not JSON",
                                            event_type="untranslatable", retryable_hint=True), now)
                return
            body = compact_json(translate_whole(self.speaks, core.api.name, parsed,
                                                model=self.upstream.model or ""))
        if not self._commit_whole(core, "body"):
            core.client.send_whole(self.status, forwarded_response_headers(self.headers), body, self.upstream.name)
        core.finish()

    def _in_client_shape(self, core: Core, answered: Answered, info: ErrorInfo) -> Answered:
        """A translated upstream's failure as the client gets it, now or when the route is
        exhausted later (the attempt still shows what its upstream sent)."""
        told = in_client_shape(core.api.name, info, answered.record)
        if core.end.last_answered is answered:
            core.end.last_answered = told
        return told

    def _commit_whole(self, core: Core, first_event: str) -> bool:
        """Commit a non-streaming answer; True if the client already had a stream's
        headers (keepalive promised one), and was told in-band that this is none."""
        core.commit_whole(self, first_event)
        core.client.passing_from(self.secrets)
        if not core.client.headers_sent:
            return False
        core.client.announce(self.upstream.name)
        core.client.error_event(NOT_A_STREAM, "non_streaming_answer")
        core.stop(self)
        core.finish()
        return True

    # --- a stream -------------------------------------------------------------------------

    def passes(self, chunk: bytes) -> bool:
        gate = self.gate
        return self.phase == "output" and gate is not None and gate.passes(chunk)

    def data(self, core: Core, chunk: bytes, now: float) -> None:
        if self.phase in ("forwarding", "rest"):
            core.client.write(chunk)
            return
        gate = self.gate
        assert gate is not None
        step = gate.feed(chunk)
        if step.failure is not None:  # before output: this attempt is discarded
            self._failed_in_stream(core, step.failure, now)
            return
        committed = step.committed
        if committed:
            self.phase = "output"
        core.output(self, step)
        if committed:
            core.out(Expect(self.number, quiet=self.deadlines.quiet_after_output))

    def ended(self, core: Core, error: BaseException | None, now: float) -> None:
        if self.phase in ("forwarding", "rest"):
            if error is not None:
                core.client.cut()  # a clean end would claim a complete answer
            core.finish()
            return
        gate = self.gate
        assert gate is not None
        if error is not None:
            if not gate.committed:
                self._show(core, gate.held())
                core.failed(self, transport_failure(error), now)
            elif not gate.complete:
                core.cut(self, "upstream connection broke after output", "stream_cut", now)
            else:
                core.finish()
            return
        # an end marker in an unterminated last frame reaches no client (an event is
        # dispatched at its blank line): the answer is whole only if it was before
        whole = gate.complete
        step = gate.finish()
        if step.failure is not None:
            self._failed_in_stream(core, step.failure, now, at_end=True)
            return
        if not whole:
            # the unterminated last frame of a cut stream: clients discard it,
            # and the in-band error must not run into it
            step.emit = b""
        if step.committed:
            self.phase = "output"
        core.output(self, step)
        self._report_dropped(core)
        if not whole and not core.exchange.suppressed_failover:
            core.cut(self, "upstream ended the stream before completing the answer", "stream_cut", now)
        else:
            core.finish()

    def _report_dropped(self, core: Core) -> None:
        """What a translated answer carried that the client's API could not take: one line."""
        translator = self.translator
        if translator is not None and translator.dropped:
            observe.emit(logging.INFO, "switchyard.translation_dropped", route=core.route.name,
                         upstream=self.upstream.name, attempt=self.number, api=self.speaks,
                         dropped=",".join(sorted(translator.dropped)), **core.log.context)

    def timed_out(self, core: Core, now: float) -> None:
        if self.phase in ("forwarding", "rest"):
            core.client.cut()  # stalled
            core.stop(self)
            core.finish()
            return
        gate = self.gate
        if gate is None or not gate.committed:
            if gate is not None:
                self._show(core, gate.held())
            core.failed(self, self.deadlines.silent_while_staged(now), now, timed_out=True)
        elif not gate.complete:
            # given up on: it must not go on generating while another finishes the answer
            core.stop(self)
            core.cut(self, self.deadlines.stalled_message(), "stream_stalled", now)
        else:
            core.stop(self)
            core.finish()  # after the API's end marker, quiet is no stall: the answer is whole

    def _show(self, core: Core, body: bytes) -> None:
        """What an answer that stalled or broke off before output had sent: shown with the
        attempt in mitmweb (its head and frames), never forwarded."""
        core.end.show(self.record, self.status, self.headers, redact_bytes(body, self.secrets))

    def _failed_in_stream(self, core: Core, failure: Classification, now: float, *, at_end: bool = False) -> None:
        gate = self.gate
        assert gate is not None
        info = failure.error or ErrorInfo(message="failure")
        held = redact_bytes(gate.held(), self.secrets)
        if info in SAID_NOTHING:
            # shown in mitmweb, never forwarded: as sent it would read as an empty success;
            # the last failure that said something is forwarded, else Switchyard's own error
            core.end.show(self.record, self.status, self.headers, held)
            core.failed(self, info, now, headers=self.headers)
            return
        answered = core.end.keep(self.record, self.status, self.headers, held)
        if self.speaks is not None:
            # told in the client's API, never the upstream's bytes
            told = self._in_client_shape(core, answered, info)

            def tell() -> None:
                core.end.forward(told, info)
                core.finish()

            core.failed(self, info, now, headers=self.headers, forward=tell)
            return

        def forward() -> None:
            # the last possible attempt: the client gets it as the provider sent it, and the rest as it comes
            self.record.reached("forwarded")
            self.phase = "forwarding"
            core.end.gave_up(answered)
            client = core.client
            client.passing_from(self.secrets)
            if not client.headers_sent:
                client.start(self.status, answered.headers, self.upstream.name)
            client.write(gate.pass_through())
            if at_end:
                core.finish()
            else:
                core.out(Expect(self.number, quiet=self.deadlines.quiet_after_output))

        core.failed(self, info, now, headers=self.headers, forward=forward)
