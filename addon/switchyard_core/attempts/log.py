"""The record of one exchange's attempts, and its log lines, with its secrets redacted.

Each event of an attempt (failed, committed, a failure after output) is written
here once: to the attempt's `AttemptRecord`, which the flow's story is made from,
and to the log.

Only facts chosen here are logged (route, upstream, attempt, phase, status,
code, type, event, decision, message, request id).  A provider's error message
can echo a key; every credential value the exchange carries is replaced by
`[redacted]` before it is logged or recorded.
"""

from __future__ import annotations

import logging

from .. import observe
from ..apis import ErrorInfo
from ..exchange import AttemptOutcome, AttemptRecord, Exchange
from ..redaction import credential_query_values, redact, secret_values


class AttemptLog:
    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.route = exchange.route.name
        self.api = exchange.route.api
        # found when a message is first redacted: most exchanges never fail
        self._secrets: tuple[str, ...] | None = None
        self._quiet_commit: tuple[AttemptRecord, str] | None = None
        # fields every line of this exchange carries besides its own (a WebSocket turn's transport and number)
        self.context: dict[str, object] = {}

    def redact(self, text: str) -> str:
        secrets = self._secrets
        if secrets is None:
            exchange = self.exchange
            upstreams = exchange.route.upstreams
            in_queries = credential_query_values(exchange.request.url, *(u.url for u in upstreams if u.url))
            secrets = self._secrets = secret_values(exchange.request.headers, upstreams, in_queries)
        return redact(text, secrets)

    def fields(self, record: AttemptRecord) -> dict[str, object]:
        return {"route": self.route, "upstream": record.upstream, "attempt": record.attempt, "request_id": record.request_id,
                **self.context}

    def failed(self, record: AttemptRecord, info: ErrorInfo, decision: AttemptOutcome, delay_s: float | None) -> None:
        """A failure before output, and what it led to."""
        record.failed(info, decision, self.redact(info.message))
        observe.emit(
            logging.INFO if decision in ("retry", "next_upstream") else logging.WARNING,
            "switchyard.attempt_failed",
            route=self.route,
            upstream=record.upstream,
            attempt=record.attempt,
            phase=record.phase,
            status=record.status,
            code=info.code,
            type=info.type,
            event=info.event_type,
            fault=record.fault,
            decision=decision,
            delay_s=round(delay_s, 3) if delay_s is not None else None,
            message=self.redact(info.message),
            request_id=record.request_id,
            **self.context,
        )

    def committed(self, record: AttemptRecord, first_event: str) -> None:
        record.committed()
        if len(self.exchange.attempts) > 1:
            # the same upstream again (`retries`), or the next one
            same = all(earlier.upstream == record.upstream for earlier in self.exchange.attempts)
            event = "switchyard.retry_answered" if same else "switchyard.fallback_answered"
            observe.emit(logging.INFO, event, **self.fields(record), first_event=first_event)
        else:
            # the first answer's plain success: logged when the exchange ends, not now.
            # Now is the first token's moment, and a log line (its formatting, the
            # terminal write, mitmproxy's log hook over every addon) would delay it
            self._quiet_commit = (record, first_event)

    def finished(self) -> None:
        """The exchange is over: the line deferred by `committed`, with how it ended."""
        if self._quiet_commit is not None:
            record, first_event = self._quiet_commit
            self._quiet_commit = None
            if not observe.shown_anywhere(logging.DEBUG):
                return  # one line per answer: only where it is seen (see shown_anywhere)
            observe.emit(logging.DEBUG, "switchyard.committed", **self.fields(record), first_event=first_event,
                         first_output_after_s=record.duration_s, outcome=self.exchange.outcome)

    def suppressed(self, record: AttemptRecord, info: ErrorInfo | None, event_type: str | None) -> None:
        """A failure after output: forwarded, never replayed.  The first one is the attempt's story."""
        if not self.exchange.suppressed_failover:
            record.failed_after_output(info, event_type, self.redact(info.message) if info and info.message else None)
        self.exchange.suppressed_failover = True
        observe.emit(
            logging.WARNING,
            observe.SUPPRESSED_AFTER_OUTPUT,
            route=self.route,
            upstream=record.upstream,
            api=self.api,
            event=event_type,
            status=info.status if info else None,
            code=(info.code or info.type) if info else None,
            message=self.redact(info.message) if info else None,
            request_id=record.request_id,
            **self.context,
        )

    def client_gone(self) -> None:
        observe.emit(logging.INFO, "switchyard.client_gone", route=self.route, attempts=len(self.exchange.attempts))

    def cut(self, record: AttemptRecord, code: str, message: str) -> None:
        observe.emit(logging.WARNING, "switchyard.stream_cut_after_output", **self.fields(record), code=code, message=message)

    def exhausted(self, message: str) -> None:
        observe.emit(logging.WARNING, "switchyard.exhausted", route=self.route,
                     attempts=len(self.exchange.attempts), message=self.redact(message), **self.context)
