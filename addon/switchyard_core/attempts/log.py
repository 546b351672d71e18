"""The log lines of one exchange's attempts, with its secrets redacted.

Only facts chosen here are logged (route, upstream, attempt, phase, status,
code, type, event, decision, message, request id).  A provider's error message
can echo a key; every credential value the exchange carries is replaced by
`[redacted]` before it is logged or recorded.
"""

from __future__ import annotations

import logging

from .. import observe
from ..apis import ErrorInfo
from ..exchange import AttemptRecord, Exchange
from ..redaction import redact, secret_values
from ..upstreams.messages import credential_query_values


class AttemptLog:
    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.route = exchange.route.name
        self.api = exchange.route.api
        upstreams = exchange.route.upstreams
        in_queries = credential_query_values(exchange.request.url, *(u.url for u in upstreams if u.url))
        self._secrets = secret_values(exchange.request.headers, upstreams, in_queries)
        self._quiet_commit: tuple[AttemptRecord, str] | None = None

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def fields(self, record: AttemptRecord) -> dict[str, object]:
        return {"route": self.route, "upstream": record.upstream, "attempt": record.attempt, "request_id": record.request_id}

    def failed(self, record: AttemptRecord, info: ErrorInfo, decision: str, delay_s: float | None) -> None:
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
        )

    def committed(self, record: AttemptRecord, first_event: str) -> None:
        if len(self.exchange.attempts) > 1:
            # the same upstream again (`retries`), or the next one
            same = all(earlier.upstream == record.upstream for earlier in self.exchange.attempts)
            event = "switchyard.retry_answered" if same else "switchyard.fallback_answered"
            observe.emit(logging.INFO, event, **self.fields(record), first_event=first_event)
        else:
            # the first answer's plain success: logged when the exchange ends, not now.
            # Now is the first token's moment, and a log line (its formatting, the
            # terminal write, mitmproxy's log hook over every addon) cost it ~0.1 ms
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
        """A failure after output: forwarded, never replayed."""
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
        )

    def cut(self, record: AttemptRecord, code: str, message: str) -> None:
        observe.emit(logging.WARNING, "switchyard.stream_cut_after_output", **self.fields(record), code=code, message=message)

    def exhausted(self, message: str) -> None:
        observe.emit(logging.WARNING, "switchyard.exhausted", route=self.route,
                     attempts=len(self.exchange.attempts), message=self.redact(message))
