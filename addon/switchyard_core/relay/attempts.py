"""The attempt loop: try upstreams in order until one produces output.

Each attempt either commits (the client gets that upstream's answer, and
nothing is ever replayed afterwards), fails before output (discarded: retry
the same upstream within budget, or move on), or is the last possible one,
in which case its failure is forwarded as the provider sent it.  The client
side is a `ClientSink`; the upstream side is `UpstreamClient`; this module
holds only the policy between them.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from .. import observe
from ..gate import Gate, GateStep
from ..protocols import APIS, Api, Decision, ErrorInfo, ErrorPolicy
from ..protocols.errors import http_error_info
from ..rules import Upstream
from .exchange import AttemptRecord, Exchange
from .upstream import CREDENTIAL_HEADERS, UpstreamClient, build_request, client_headers, read_some, request_id

ERROR_BODY_LIMIT = 1024 * 1024


class ClientSink(Protocol):
    """Where the client's response goes (the relay's HTTP response)."""

    @property
    def headers_sent(self) -> bool: ...

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """What follows a failed attempt."""

    action: str  # "retry" | "next" | "give_up"
    delay_s: float = 0.0


def retry_after_s(headers: "aiohttp.typedefs.LooseHeaders | None") -> float | None:
    """`retry-after-ms`, then `retry-after` (seconds or an HTTP date), as the SDKs read them."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")  # type: ignore[union-attr]
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")  # type: ignore[union-attr]
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def plan_after_failure(
    decision: Decision,
    *,
    tries_used: int,
    budget: int,
    has_next: bool,
    timed_out: bool,
    retry_after: float | None,
    backoff_ms: int,
    max_backoff_ms: int,
) -> Plan:
    """DESIGN §4: same upstream within budget (with backoff), then the next, else give up."""
    move_on = Plan("next") if has_next else Plan("give_up")
    if decision is Decision.FATAL:
        return Plan("give_up")
    if decision is Decision.NEXT_UPSTREAM:
        return move_on
    if timed_out and has_next:
        return move_on  # retrying a silent provider only multiplies the wait
    if tries_used > budget:
        return move_on
    if retry_after is not None:
        if retry_after * 1000 > max_backoff_ms:
            return move_on
        return Plan("retry", retry_after)
    base = min(max_backoff_ms, backoff_ms * 2 ** (tries_used - 1))
    return Plan("retry", base * (1 - 0.25 * random.random()) / 1000)


@dataclass(slots=True)
class _Failed:
    info: ErrorInfo
    decision: Decision
    plan: Plan
    timed_out: bool = False


@dataclass(slots=True)
class _Captured:
    """A failure as the provider sent it, kept in case it turns out to be the last."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class TransportFailure(Exception):
    def __init__(self, info: ErrorInfo, *, timed_out: bool = False) -> None:
        super().__init__(info.message)
        self.info = info
        self.timed_out = timed_out


SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]


class AttemptLoop:
    def __init__(self, exchange: Exchange, http: UpstreamClient, sink: ClientSink) -> None:
        self.exchange = exchange
        self.route = exchange.route
        self.settings = exchange.route.settings
        self.api: Api = APIS[exchange.route.api]
        self.policy = ErrorPolicy(self.settings.retry_on)
        self.http = http
        self.sink = sink
        self._secrets = _secrets_of(exchange)
        self._keepalive: asyncio.Task[None] | None = None
        self._last_answered: _Captured | None = None
        self._winner: AttemptRecord | None = None

    # --- the loop -------------------------------------------------------------

    async def run(self) -> None:
        if self.exchange.request.wants_stream and self.settings.pre_answer_keepalive_s > 0:
            self._keepalive = asyncio.create_task(self._send_keepalives())
        try:
            await self._run()
        finally:
            await self._stop_keepalive()

    async def _run(self) -> None:
        upstreams = self.route.upstreams
        last: _Failed | None = None
        for index, upstream in enumerate(upstreams):
            has_next = index + 1 < len(upstreams)
            tries = 0
            while True:
                tries += 1
                outcome = await self._attempt(upstream, tries, has_next)
                if outcome is None:
                    return  # the client got an answer
                last = outcome
                if outcome.plan.action == "retry":
                    await asyncio.sleep(outcome.plan.delay_s)
                    continue
                if outcome.plan.action == "next":
                    break
                await self._exhausted(outcome)
                return
        if last is not None:
            await self._exhausted(last)

    # --- one attempt --------------------------------------------------------------

    async def _attempt(self, upstream: Upstream, tries: int, has_next: bool) -> _Failed | None:
        request = build_request(self.exchange.request, upstream)
        record = AttemptRecord(
            attempt=len(self.exchange.attempts) + 1,
            upstream=upstream.name,
            url=request.url,
            started=time.monotonic(),
        )
        self.exchange.attempts.append(record)
        settings = self.settings
        first_output_s = settings.first_output_timeout_s if self.exchange.request.wants_stream else 0.0
        headers_s = min(t for t in (settings.headers_timeout_s, first_output_s, float("inf")) if t > 0)

        def fail(info: ErrorInfo, *, timed_out: bool = False, should_retry: str | None = None,
                 retry_after: float | None = None) -> _Failed:
            decision = self.policy.decide(info, should_retry)
            plan = plan_after_failure(
                decision,
                tries_used=tries,
                budget=upstream.retries,
                has_next=has_next,
                timed_out=timed_out,
                retry_after=retry_after,
                backoff_ms=settings.backoff_ms,
                max_backoff_ms=settings.max_backoff_ms,
            )
            record.status, record.code, record.message = info.status, info.code or info.type, info.message
            record.event_type = info.event_type
            return _Failed(info, decision, plan, timed_out)

        try:
            async with asyncio.timeout(headers_s if headers_s != float("inf") else None):
                response = await self.http.open(request, connect_timeout_s=settings.connect_timeout_s)
        except TimeoutError:
            timed = "no output" if first_output_s and first_output_s <= settings.headers_timeout_s else "no response headers"
            failed = fail(ErrorInfo(status=504, message=f"{timed} within {headers_s:g}s", event_type="timeout"), timed_out=True)
            self._log_failed(record, failed)
            return failed
        except (aiohttp.ClientError, OSError) as exc:
            failed = fail(_transport_info(exc))
            self._log_failed(record, failed)
            return failed

        try:
            record.phase = "headers"
            record.status = response.status
            record.request_id = request_id(response.headers)
            if not 200 <= response.status < 300:
                return await self._http_failure(response, record, fail)
            content_type = response.headers.get("Content-Type", "").lower()
            if "text/event-stream" in content_type:
                return await self._stream(response, upstream, record, fail, first_output_s)
            return await self._whole(response, upstream, record, fail)
        finally:
            response.close()

    async def _http_failure(self, response: aiohttp.ClientResponse, record: AttemptRecord, fail) -> _Failed | None:  # type: ignore[no-untyped-def]
        body = await self._read_error_body(response)
        info = http_error_info(response.status, body)
        failed = fail(
            info,
            should_retry=response.headers.get("x-should-retry"),
            retry_after=retry_after_s(response.headers),
        )
        self._log_failed(record, failed)
        captured = _Captured(response.status, client_headers(response.headers), body)
        self._last_answered = captured
        if failed.plan.action == "give_up":
            await self._forward_failure(captured, info, record)
            return None
        return failed

    async def _read_error_body(self, response: aiohttp.ClientResponse) -> bytes:
        """An error body, bounded in size and time: it should follow its headers promptly."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.headers_timeout_s or self.settings.request_timeout_s or None):
                while size < ERROR_BODY_LIMIT:
                    chunk, error = await read_some(response.content)
                    chunks.append(chunk)
                    size += len(chunk)
                    if not chunk or error is not None:
                        break
        except TimeoutError:
            pass
        return b"".join(chunks)[:ERROR_BODY_LIMIT]

    async def _whole(self, response: aiohttp.ClientResponse, upstream: Upstream, record: AttemptRecord, fail) -> _Failed | None:  # type: ignore[no-untyped-def]
        """A non-streaming answer: a 2xx without an error object commits."""
        record.phase = "body"
        try:
            async with asyncio.timeout(self.settings.request_timeout_s or None):
                body = await response.read()
        except TimeoutError:
            failed = fail(ErrorInfo(status=504, message="no complete answer within request_timeout_s", event_type="timeout"), timed_out=True)
            self._log_failed(record, failed)
            return failed
        except (aiohttp.ClientError, OSError) as exc:
            failed = fail(_transport_info(exc))
            self._log_failed(record, failed)
            return failed
        headers = client_headers(response.headers)
        info = None
        if "json" in response.headers.get("Content-Type", "").lower():
            try:
                info = self.api.body_error(json.loads(body))
            except (ValueError, RecursionError):
                info = None
        if info is not None:
            failed = fail(info, should_retry=response.headers.get("x-should-retry"))
            self._log_failed(record, failed)
            self._last_answered = _Captured(response.status, headers, body)
            if failed.plan.action == "give_up":
                await self._forward_failure(self._last_answered, info, record)
                return None
            return failed
        self._commit(record, upstream, "body")
        await self._stop_keepalive()
        if self.sink.headers_sent:
            await self.sink.write(body)  # keepalive already promised a stream; best effort
        else:
            await self.sink.send_whole(response.status, self._with_ours(headers), body)
        return None

    async def _stream(self, response: aiohttp.ClientResponse, upstream: Upstream, record: AttemptRecord, fail, first_output_s: float) -> _Failed | None:  # type: ignore[no-untyped-def]
        settings = self.settings
        gate = Gate(
            self.api.stream_classifier(),
            staging_limit=settings.staging_limit,
            rewrite_capacity_codes=settings.rewrite_capacity_codes,
        )
        record.phase = "staging"
        deadline = record.started + first_output_s if first_output_s else None
        stream = response.content
        while True:
            if gate.committed:
                wait = settings.idle_timeout_s or None
            else:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                async with asyncio.timeout(wait):
                    chunk, error = await read_some(stream)
            except TimeoutError:
                if gate.committed:
                    await self._end_cut(record, f"upstream sent nothing for {settings.idle_timeout_s:g}s after output", "stream_stalled")
                    return None
                failed = fail(ErrorInfo(status=504, message=f"no output within {first_output_s:g}s", event_type="timeout"), timed_out=True)
                self._log_failed(record, failed)
                return failed
            if chunk:
                step: GateStep | None = gate.feed(chunk)
            else:
                step = gate.finish() if error is None else None
            if step is not None:
                outcome = await self._apply(step, gate, response, upstream, record, fail)
                if outcome is not _CONTINUE:
                    return outcome  # type: ignore[return-value]
            if error is not None:
                if gate.committed:
                    if gate.complete:
                        return None
                    await self._end_cut(record, "upstream connection broke after output", "stream_cut")
                    return None
                failed = fail(_transport_info(error))
                self._log_failed(record, failed)
                return failed
            if not chunk:
                # end of the upstream body; finish() above committed or failed
                if not gate.complete and not self.exchange.suppressed_failover:
                    await self._end_cut(record, "upstream ended the stream before completing the answer", "stream_cut")
                return None

    async def _apply(self, step: GateStep, gate: Gate, response: aiohttp.ClientResponse, upstream: Upstream, record: AttemptRecord, fail) -> "_Failed | None | object":  # type: ignore[no-untyped-def]
        if step.failure is not None:
            info = step.failure.error or ErrorInfo(message="failure")
            failed = fail(info, should_retry=response.headers.get("x-should-retry"))
            self._log_failed(record, failed)
            headers = client_headers(response.headers)
            if failed.plan.action != "give_up":
                self._last_answered = _Captured(response.status, headers, gate.give_up())
                return failed
            # the last possible attempt: the client gets it as the provider sent it
            record.phase = "forwarded"
            await self._stop_keepalive()
            if not self.sink.headers_sent:
                await self.sink.start(response.status, self._with_ours(headers))
            await self.sink.write(gate.give_up())
            await self._pass_rest(response)
            self.exchange.outcome = "gave_up"
            return None
        if step.committed:
            self._commit(record, upstream, step.first_event or "output")
            await self._stop_keepalive()
            if self.sink.headers_sent:
                await self.sink.write(
                    f": switchyard upstream={upstream.name} attempts={len(self.exchange.attempts)}\n\n".encode()
                )
            else:
                await self.sink.start(response.status, self._with_ours(client_headers(response.headers)))
        for failure in step.failures_after_output:
            self._log_suppressed(record, failure.error, failure.event_type)
        if step.emit:
            await self.sink.write(step.emit)
        return _CONTINUE

    async def _pass_rest(self, response: aiohttp.ClientResponse) -> None:
        while True:
            try:
                async with asyncio.timeout(self.settings.idle_timeout_s or None):
                    chunk, error = await read_some(response.content)
            except TimeoutError:
                return
            if chunk:
                await self.sink.write(chunk)
            if error is not None or not chunk:
                return

    # --- endings ------------------------------------------------------------------

    def _commit(self, record: AttemptRecord, upstream: Upstream, first_event: str) -> None:
        record.phase = "output"
        record.finish("committed")
        self._winner = record
        self.exchange.answered_by = upstream.name
        self.exchange.answered_url = record.url
        self.exchange.outcome = "committed"
        fields = self._fields(record)
        if len(self.exchange.attempts) > 1:
            observe.emit(logging.INFO, "switchyard.fallback_answered", **fields, first_event=first_event)
        else:
            observe.emit(logging.DEBUG, "switchyard.committed", **fields, first_event=first_event)

    async def _end_cut(self, record: AttemptRecord, message: str, code: str) -> None:
        """A stream that broke after output must not look like a clean end."""
        observe.emit(logging.WARNING, "switchyard.stream_cut_after_output", **self._fields(record), code=code, message=message)
        await self.sink.write(self.api.error_event(f"switchyard: {message}", code))

    async def _forward_failure(self, captured: _Captured, info: ErrorInfo, record: AttemptRecord) -> None:
        self.exchange.outcome = "gave_up"
        await self._stop_keepalive()
        if self.sink.headers_sent:
            await self.sink.write(self.api.error_event(info.message or "upstream failed", info.code or info.type or "upstream_error"))
        else:
            await self.sink.send_whole(captured.status, self._with_ours(captured.headers), captured.body)

    async def _exhausted(self, last: _Failed) -> None:
        """Nothing left to try and no upstream response open to forward."""
        self.exchange.outcome = "exhausted"
        await self._stop_keepalive()
        fields = {"route": self.route.name, "attempts": len(self.exchange.attempts)}
        observe.emit(logging.WARNING, "switchyard.exhausted", **fields, message=self._redact(last.info.message))
        if self.sink.headers_sent:
            code = "upstream_timeout" if last.timed_out else "upstream_unavailable"
            await self.sink.write(self.api.error_event(f"switchyard: every upstream failed; last: {last.info.message}", code))
            return
        if self._last_answered is not None:
            captured = self._last_answered
            await self.sink.send_whole(captured.status, self._with_ours(captured.headers), captured.body)
            return
        status = 504 if last.timed_out else 502
        code = "upstream_timeout" if last.timed_out else "upstream_unavailable"
        body = self.api.error_body(f"switchyard: no upstream answered; last: {last.info.message}", code)
        await self.sink.send_whole(status, self._with_ours([("Content-Type", "application/json")]), body)

    async def fail_internally(self, what: str) -> None:
        message = f"switchyard: internal error ({what}); see the mitmproxy log"
        if self.sink.headers_sent:
            await self.sink.write(self.api.error_event(message, "switchyard_internal_error"))
        else:
            body = self.api.error_body(message, "switchyard_internal_error")
            await self.sink.send_whole(502, self._with_ours([("Content-Type", "application/json")]), body)

    # --- keepalive ----------------------------------------------------------------

    async def _send_keepalives(self) -> None:
        interval = self.settings.pre_answer_keepalive_s
        while True:
            await asyncio.sleep(interval)
            if not self.sink.headers_sent:
                await self.sink.start(200, self._with_ours(list(SSE_HEADERS), pending=True))
            await self.sink.write(b": switchyard keepalive\n\n")

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if asyncio.current_task() is not None and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise

    # --- helpers ------------------------------------------------------------------

    def _with_ours(self, headers: list[tuple[str, str]], *, pending: bool = False) -> list[tuple[str, str]]:
        upstream = "pending" if pending else (self.exchange.attempts[-1].upstream if self.exchange.attempts else "none")
        return [
            *headers,
            ("x-switchyard-upstream", upstream),
            ("x-switchyard-attempts", "pending" if pending else str(len(self.exchange.attempts))),
        ]

    def _fields(self, record: AttemptRecord) -> dict[str, object]:
        return {
            "route": self.route.name,
            "upstream": record.upstream,
            "attempt": record.attempt,
            "request_id": record.request_id,
        }

    def _log_failed(self, record: AttemptRecord, failed: _Failed) -> None:
        outcome = {"retry": "retry", "next": "next_upstream", "give_up": "give_up"}[failed.plan.action]
        if failed.decision is Decision.FATAL:
            outcome = "fatal"
        record.finish(outcome)
        info = failed.info
        observe.emit(
            logging.INFO if outcome in ("retry", "next_upstream") else logging.WARNING,
            "switchyard.attempt_failed",
            route=self.route.name,
            upstream=record.upstream,
            attempt=record.attempt,
            phase=record.phase,
            status=info.status,
            code=info.code,
            type=info.type,
            event=info.event_type,
            decision=outcome,
            delay_s=round(failed.plan.delay_s, 3) if failed.plan.action == "retry" else None,
            message=self._redact(info.message),
            request_id=record.request_id,
        )

    def _log_suppressed(self, record: AttemptRecord, info: ErrorInfo | None, event_type: str | None) -> None:
        self.exchange.suppressed_failover = True
        observe.emit(
            logging.WARNING,
            observe.SUPPRESSED_AFTER_OUTPUT,
            route=self.route.name,
            upstream=record.upstream,
            api=self.api.name,
            event=event_type,
            status=info.status if info else None,
            code=(info.code or info.type) if info else None,
            message=self._redact(info.message) if info else None,
            request_id=record.request_id,
        )

    def _redact(self, text: str) -> str:
        """Upstreams sometimes echo a key in their error message; never log it."""
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text


_CONTINUE = object()


def _secrets_of(exchange: Exchange) -> tuple[str, ...]:
    """Credential values this exchange carries: the client's and its upstreams'."""
    values: list[str] = []
    for name, value in exchange.request.headers:
        if name.lower() in CREDENTIAL_HEADERS:
            values.append(value)
    for upstream in exchange.route.upstreams:
        if upstream.auth is not None:
            values.append(upstream.auth[1])
    found: set[str] = set()
    for value in values:
        for part in (value, *value.split()):
            if len(part) >= 8:
                found.add(part)
    return tuple(sorted(found, key=len, reverse=True))


def _transport_info(exc: BaseException) -> ErrorInfo:
    """A transport failure, described without anything from the request."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        what = "name does not resolve"
    elif isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        what = "TLS handshake failed"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        what = "connection refused or unreachable"
    elif isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | ConnectionResetError):
        what = "connection reset"
    else:
        what = type(exc).__name__
    return ErrorInfo(status=502, message=what, event_type="transport")
