"""Outage memory: what one request learns about an upstream that later requests act on.

Pure: values in, values out, and the time is always passed in (`now`, seconds on one
monotonic clock), never read here.  docs/outages.md says what users see; the rules:

- A failure that states a delay (Retry-After, retry-after-ms, Gemini's RetryInfo) makes
  later requests skip that upstream until the delay has passed, at most `max_skip_s`.
- An upstream that cannot be reached or does not answer is skipped for
  `unreachable_skip_s`; after that one request, the probe, tries it while the others go
  on skipping it.  Any answer from it ends that memory; another failure to reach it
  starts the skip again.
- A capacity event that states no delay is never remembered: capacity shedding is
  transient and per request, and cooling an upstream down on it would send traffic away
  from a provider that answers most requests.  The caller says only what happened
  (`FailureKind`); what is remembered is decided here, so no caller can get it wrong.
- A skipped upstream is not tried by a request that has an upstream not skipped: the
  skip exists so that no request pays for it again.  A request is never failed without
  a try: when every upstream of a route is skipped, all are tried, the one due soonest
  first.

Memory is keyed by (route name, upstream name) and lives in one `Outages`, which belongs
to one set of loaded rules: a reload makes a new one (or calls `forget`), so a renamed
upstream, or a name that now stands for another URL, starts with nothing remembered.
Two routes that share a provider learn about it separately.  Nothing is shared between
processes.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

from ..apis import Decision
from ..rules import AttemptSettings, Route, Upstream


class FailureKind(enum.Enum):
    """What happened to one attempt, as the caller knows it (not what is remembered)."""

    UNREACHABLE = "unreachable"  # no connection: refused, a name that does not resolve, TLS, connect timeout
    NO_ANSWER = "no answer"  # connected, but no response head in time (headers_timeout_s; unstreamed, request_timeout_s)
    ANSWERED = "answered"  # the upstream sent a failure worth another try or upstream: an HTTP error, an
    # error frame, an empty or cut stream, no output within first_output_timeout_s once the head came
    FATAL = "fatal"  # the upstream sent a failure that is returned as sent

    @classmethod
    def of_answer(cls, decision: Decision) -> FailureKind:
        """An answered failure's kind, from the error policy's decision on it."""
        return cls.FATAL if decision is Decision.FATAL else cls.ANSWERED


class SkipReason(enum.Enum):
    STATED_DELAY = "said to wait"
    UNREACHABLE = "cannot be reached"
    NO_ANSWER = "did not answer"


@dataclass(frozen=True, slots=True)
class Skip:
    """Why later requests skip an upstream, and until when."""

    reason: SkipReason
    detail: str  # the failure in the caller's words ("connection refused", "429 rate_limit_error")
    until: float  # on the caller's clock
    left_s: float  # 0 once only a probe is awaited
    asked_s: float | None = None  # a stated delay as the upstream stated it (it may be over the cap)
    capped: bool = False  # the stated delay was cut to max_skip_s
    probing: bool = False  # another request is trying it now

    @property
    def why(self) -> str:
        """The reason in words, without the time left (a log line's `why`)."""
        what = self.reason.value
        if self.asked_s is not None:
            what += f" {self.asked_s:g}s" + (", capped by max_skip_s" if self.capped else "")
        return f"{what} ({self.detail})" if self.detail else what

    def describe(self) -> str:
        """The reason and what comes next: the time left, else the probe."""
        if self.left_s > 0:
            return f"{self.why}; {self.left_s:.1f}s left"
        if self.probing:
            return f"{self.why}; a probe is in flight"
        return f"{self.why}; the next request probes it"


@dataclass(frozen=True, slots=True)
class Choice:
    """One upstream in a request's order."""

    upstream: Upstream
    skip: Skip | None  # set: skipped (or, when every upstream is, tried anyway)
    probe: bool = False  # this request's try of it is the one probe after it could not be reached


@dataclass(frozen=True, slots=True)
class Order:
    """In what order one request tries a route's upstreams, and which it passes over."""

    tried: tuple[Choice, ...]  # never empty; each carries its skip when every upstream was skipped
    passed_over: tuple[Choice, ...]  # skipped and not tried: one `skipped` log line each

    @property
    def upstreams(self) -> tuple[Upstream, ...]:
        """The upstreams to try, in order (what the attempt core iterates)."""
        return tuple(choice.upstream for choice in self.tried)

    @property
    def all_skipped(self) -> bool:
        return self.tried[0].skip is not None


@dataclass(frozen=True, slots=True)
class Remembered:
    """One line of `switchyard.status`: an upstream later requests skip."""

    route: str
    upstream: str
    skip: Skip

    def describe(self) -> str:
        return f"route={self.route} upstream={self.upstream} skipped: {self.skip.describe()}"


@dataclass(slots=True)
class _Memory:
    reason: SkipReason
    detail: str
    until: float
    asked_s: float | None = None
    capped: bool = False
    prober: int | None = None  # the visit that holds the probe claim

    def skip(self, now: float) -> Skip:
        return Skip(self.reason, self.detail, self.until, max(0.0, self.until - now), self.asked_s, self.capped,
                    probing=self.prober is not None)

    @property
    def probed(self) -> bool:
        """Whether it ends with a probe (one request) rather than for every request at once."""
        return self.reason is not SkipReason.STATED_DELAY


_Key = tuple[str, str]


class Outages:
    """The memory of one process for one set of loaded rules."""

    def __init__(self) -> None:
        self._memory: dict[_Key, _Memory] = {}
        self._generation = 0
        self._visits = itertools.count(1)

    def begin(self, route: Route, now: float) -> Visit:
        """A request on `route` starts: its order, and the probes it claims (see `Visit`)."""
        visit = Visit(self, route, next(self._visits), self._generation)
        ready: list[Choice] = []
        skipped: list[tuple[float, Choice]] = []
        for upstream in route.upstreams:
            memory = self._live((route.name, upstream.name), now)
            if memory is None:
                ready.append(Choice(upstream, None))
            elif memory.until <= now and memory.prober is None:
                memory.prober = visit.id  # lapsed, and nobody is trying it: this request probes it
                ready.append(Choice(upstream, None, probe=True))
            else:
                skipped.append((memory.until, Choice(upstream, memory.skip(now))))
        by_due = tuple(choice for _, choice in sorted(skipped, key=lambda item: item[0]))  # stable: route order on ties
        visit.order = Order(tuple(ready), by_due) if ready else Order(by_due, ())
        return visit

    def remembered(self, now: float) -> list[Remembered]:
        """Every upstream later requests skip (or are about to probe), in no particular order of routes."""
        found = []
        for (route, upstream), _ in list(self._memory.items()):
            memory = self._live((route, upstream), now)
            if memory is not None:
                found.append(Remembered(route, upstream, memory.skip(now)))
        return found

    def status(self, now: float) -> list[str]:
        """`switchyard.status`'s lines: one per upstream being skipped."""
        return [entry.describe() for entry in sorted(self.remembered(now), key=lambda e: (e.route, e.upstream))]

    def forget(self) -> None:
        """Drop everything; what requests begun before learn from now on is dropped too."""
        self._memory.clear()
        self._generation += 1

    def _live(self, key: _Key, now: float) -> _Memory | None:
        """The memory under `key`, once a stated delay that has passed is let go."""
        memory = self._memory.get(key)
        if memory is not None and not memory.probed and memory.until <= now:
            del self._memory[key]
            return None
        return memory


class Visit:
    """One request's dealings with the memory: its order, the probes it claimed, what it reports.

    Report each attempt's verdict (`failed`, `succeeded`), and call `end` when the request
    ends however it ends (a `finally`): a probe claimed by a request that never tried the
    upstream, or that ended without a verdict (the client left, a hedge lost), is let go
    there so that the next request probes instead.  Reports on a visit begun before
    `Outages.forget` change nothing.
    """

    def __init__(self, outages: Outages, route: Route, visit_id: int, generation: int) -> None:
        self.id = visit_id
        self.order = Order((), ())  # set by Outages.begin
        self._outages = outages
        self._route = route.name
        self._settings: AttemptSettings = route.settings
        self._generation = generation
        self._upstreams = tuple(upstream.name for upstream in route.upstreams)

    @property
    def probes(self) -> frozenset[str]:
        """The upstreams whose probe this request holds and has not settled.  Read from the
        memory itself: another request's verdict may have ended the memory meanwhile."""
        memories = self._memories()
        if memories is None:
            return frozenset()
        return frozenset(name for name in self._upstreams
                         if (memory := memories.get((self._route, name))) is not None and memory.prober == self.id)

    def failed(self, upstream: str, kind: FailureKind, now: float, *,
               retry_after_s: float | None = None, detail: str = "") -> Skip | None:
        """An attempt on `upstream` failed before output.  Returns the skip later requests
        will see (None: nothing is remembered, and any skip for being unreachable is over
        when it answered).  `retry_after_s` is the delay the failure stated, parsed
        (`retry.retry_after_s` of its headers, else `ErrorInfo.retry_after_s`)."""
        memories = self._memories()
        if memories is None:
            return None
        key = (self._route, upstream)
        memory = self._outages._live(key, now)
        if memory is not None and memory.prober == self.id:
            memory.prober = None  # this request's probe has its verdict
        if kind in (FailureKind.UNREACHABLE, FailureKind.NO_ANSWER):
            if self._settings.unreachable_skip_s <= 0:
                return memory.skip(now) if memory is not None else None
            until = now + self._settings.unreachable_skip_s
            if memory is not None and not memory.probed and memory.until >= until:
                return memory.skip(now)  # it said to wait longer: not cut short for this
            reason = SkipReason.UNREACHABLE if kind is FailureKind.UNREACHABLE else SkipReason.NO_ANSWER
            # a probe another request is making stays the one probe: its verdict comes next
            prober = memory.prober if memory is not None and memory.probed else None
            memories[key] = _Memory(reason, detail, until, prober=prober)
            return memories[key].skip(now)
        if kind is FailureKind.ANSWERED and retry_after_s is not None and retry_after_s > 0 \
                and self._settings.max_skip_s > 0:
            capped = retry_after_s > self._settings.max_skip_s
            delay = min(retry_after_s, self._settings.max_skip_s)
            memories[key] = _Memory(SkipReason.STATED_DELAY, detail, now + delay, retry_after_s, capped)
            return memories[key].skip(now)  # its latest word, longer or shorter than what it said before
        if memory is not None and memory.probed:
            del memories[key]  # it answered: it can be reached; what it said is this request's alone
            return None
        return memory.skip(now) if memory is not None else None

    def succeeded(self, upstream: str, now: float) -> Skip | None:
        """An attempt on `upstream` produced output (it commits).  Its memory is over (the
        skip that ended is returned, for a log line); and since nothing is tried after
        output, every other probe this request claimed is let go."""
        memories = self._memories()
        memory = self._outages._live((self._route, upstream), now) if memories is not None else None
        if memories is not None and memory is not None:
            del memories[(self._route, upstream)]
        self.end()
        return memory.skip(now) if memory is not None else None

    def end(self) -> None:
        """The request is over: the probes it claimed and did not settle go to the next request."""
        for name in self._upstreams:
            self.release(name)

    def release(self, upstream: str) -> None:
        """This request will not try `upstream` after all: its probe, if it held it, goes to the next request."""
        memories = self._memories()
        memory = memories.get((self._route, upstream)) if memories is not None else None
        if memory is not None and memory.prober == self.id:
            memory.prober = None

    def _memories(self) -> dict[_Key, _Memory] | None:
        """The memory to report to, or None when it was forgotten after this visit began
        (and with it the probes this visit had claimed)."""
        if self._generation != self._outages._generation:
            return None
        return self._outages._memory
