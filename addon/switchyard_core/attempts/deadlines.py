"""Every time bound of one attempt, decided once from the route's settings and
whether the client streams.

A stream is bounded from the attempt's start until its head (`headers_timeout_s`)
and its first output (`first_output_timeout_s`), by a deadline for its first output while it is staged
(`request_timeout_s` from the attempt's start, which no comment moves: reasoning models can think for minutes before their first
token, so not `idle_timeout_s`, but some bound is needed: behind the pre-answer
keepalive a client never times out on its own), then by silence after output
(`idle_timeout_s`).  A whole (non-streaming) answer is bounded from the
attempt's start to its last byte (`request_timeout_s`).  A continuation of a
cut answer waits for its head (`headers_timeout_s`) and its first continued
character as a staged stream waits for its first output (`staged_by`, from its
own start; nothing before that character moves it), and never past
`request_timeout_s` after the cut, for all its tries together (`continued_by`);
then it is bounded by silence as output is (`idle_timeout_s`).  A setting of 0
is no bound.  Each timeout's message names the bound that passed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..apis import ErrorInfo
from ..rules import AttemptSettings


def _bound(seconds: float) -> float | None:
    return seconds if seconds > 0 else None


def _timed_out(message: str) -> ErrorInfo:
    return ErrorInfo(status=504, message=message, event_type="timeout", retryable_hint=True)


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Durations in seconds (None: no bound); `started` is the attempt's start, on `time.monotonic()`."""

    started: float
    connect: float | None  # a connection: TCP, TLS, an upstream proxy's CONNECT
    head: float | None  # from the start to the answer's head (for a stream, or its first output if sooner)
    head_waits_for: str  # what `head` waits for, as its message says
    headers: float | None  # the head alone (a continuation waits only for that)
    error_body: float | None  # an error answer's body, once its head arrived
    whole: float | None  # a whole answer, from the start to its last byte
    first_output: float | None  # a stream's first output, from the start
    quiet_staged: float | None  # silence while a stream is staged
    quiet_after_output: float | None  # silence once output went to the client

    @classmethod
    def of(cls, settings: AttemptSettings, *, streams: bool, started: float) -> Deadlines:
        if streams:
            # the head comes before the first output, which is due by request_timeout_s (and
            # first_output_timeout_s) from the start: with headers_timeout_s off, still bounded
            bounds = [t for t in (settings.headers_timeout_s, settings.first_output_timeout_s,
                                  settings.request_timeout_s) if t > 0]
            head = min(bounds) if bounds else None
            by_headers = head is None or (head == settings.headers_timeout_s and head != settings.first_output_timeout_s)
            waits_for = "response headers" if by_headers else "output"
        else:
            head = _bound(settings.request_timeout_s)  # the whole answer, headers included
            waits_for = "complete answer"
        return cls(
            started=started,
            connect=_bound(settings.connect_timeout_s),
            head=head,
            head_waits_for=waits_for,
            headers=_bound(settings.headers_timeout_s),
            error_body=_bound(settings.headers_timeout_s or settings.request_timeout_s),
            whole=_bound(settings.request_timeout_s),
            first_output=_bound(settings.first_output_timeout_s),
            quiet_staged=_bound(settings.request_timeout_s),
            quiet_after_output=_bound(settings.idle_timeout_s),
        )

    @property
    def whole_by(self) -> float | None:
        """When a whole answer must have ended (monotonic), if ever."""
        return self.started + self.whole if self.whole is not None else None

    @property
    def staged_by(self) -> float | None:
        """When a staged stream's first output must have come (monotonic), if ever: its
        `request_timeout_s` and `first_output_timeout_s`, both from the attempt's start.
        Nothing before output moves it: an upstream sending `: ping` forever must not
        hold the request forever."""
        bounds = [b for b in (self.quiet_staged, self.first_output) if b is not None]
        return self.started + min(bounds) if bounds else None

    def continued_by(self, cut_at: float) -> float | None:
        """When a continuation's first continued character is due (monotonic), if ever:
        its `staged_by`, and never later than `request_timeout_s` after the cut
        (`cut_at`, or the last continued character), which bounds every try of the
        effort together.  Comments, role chunks and empty deltas never move it."""
        dues = [due for due in (self.staged_by, self._effort_by(cut_at)) if due is not None]
        return min(dues) if dues else None

    def _effort_by(self, cut_at: float) -> float | None:
        return cut_at + self.quiet_staged if self.quiet_staged is not None else None

    # --- what each timeout says ---------------------------------------------------

    def no_continued_text(self, cut_at: float) -> str:
        """A continuation's first continued character did not come by `continued_by`."""
        effort, staged = self._effort_by(cut_at), self.staged_by
        if effort is not None and (staged is None or effort <= staged):
            return f"no continued text within {self.quiet_staged:g}s of the cut"
        bounds = [b for b in (self.quiet_staged, self.first_output) if b is not None]
        return f"no continued text within {min(bounds) if bounds else 0:g}s"

    def no_connection(self) -> ErrorInfo:
        return _timed_out(f"no connection within {self.connect or 0:g}s")

    def no_head(self) -> ErrorInfo:
        limit = f"{self.head:g}s" if self.head else "the time limit"
        return _timed_out(f"no {self.head_waits_for} within {limit}")

    def incomplete(self) -> ErrorInfo:
        return _timed_out(f"no complete answer within {self.whole or 0:g}s")

    def silent_while_staged(self, now: float) -> ErrorInfo:
        """A staged stream's first output did not come by its deadline."""
        bounds = [b for b in (self.quiet_staged, self.first_output) if b is not None]
        return _timed_out(f"no output within {min(bounds) if bounds else 0:g}s")

    def stalled_message(self, *, after_output: bool = True) -> str:
        return f"upstream sent nothing for {self.quiet_after_output or 0:g}s" + (" after output" if after_output else "")


def effort_over(settings: AttemptSettings, cut_at: float, now: float) -> bool:
    """Whether a continuation effort begun at `cut_at` (the cut, or the last continued
    character) has had its time: no further try is begun (`Deadlines.continued_by`)."""
    return settings.request_timeout_s > 0 and now >= cut_at + settings.request_timeout_s
