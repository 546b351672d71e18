"""Where a continuation's text joins what the client already has: never a character twice.

A regenerated answer is held until it covers every character the client got:
if it begins with exactly those, only the rest is forwarded; at the first
character that differs it is dropped.

A prefilled continuation should begin where the client's text ends, but two
things may come first.  It may repeat a little of its prefill (Anthropic
refuses a prefill that ends in whitespace, so that whitespace is sent to the
client but not in the request: the *echo*), skipped as far as it matches.  Or
it may restate the whole assistant text the request ended with (some
OpenAI-compatible servers do), which is held while it matches and skipped once
it is all there.  A continuation that begins like that text and then differs
cannot be placed (a second, different answer, or a restatement gone astray):
it is not used, and nothing of it reaches the client.  See
docs/architecture.md, "A request's life", step 5.
"""

from __future__ import annotations


class Diverged(Exception):
    """The continuation's text cannot follow the client's: `matched` characters agreed."""

    def __init__(self, matched: int, expected: int, why: str) -> None:
        super().__init__(f"{why} (matched {matched} of {expected} characters)")
        self.matched = matched
        self.expected = expected
        self.why = why


def overlap_for(strategy: str, client_text: str, echo: str = "", restated: str = "") -> "Overlap":
    """The overlap rule of a continuation: `regenerate` must begin with all of
    `client_text`; `prefill` may begin with its `echo` and may restate `restated`,
    the assistant text its request ended with."""
    if strategy == "regenerate":
        return Overlap(client_text, strict=True)
    return Overlap(echo, strict=False, restated=restated)


def _common(text: str, want: str) -> int:
    same, limit = 0, min(len(text), len(want))
    while same < limit and text[same] == want[same]:
        same += 1
    return same


class Overlap:
    __slots__ = ("_expected", "_matched", "_strict", "_covered", "_restated", "_seen", "_skipped")

    def __init__(self, expected: str, *, strict: bool, restated: str = "") -> None:
        """`strict`: the continuation must begin with all of `expected` (regenerate);
        else `expected` is skipped only as far as it matches (a prefill's echo), after
        `restated` if the continuation begins with all of that."""
        self._expected = expected
        self._matched = 0
        self._strict = strict
        self._restated = "" if strict else restated
        self._seen = 0  # characters held while they match `restated`: whether it is restated is open
        self._skipped = 0  # characters of the continuation's text the client is not given
        self._covered = not expected and not self._restated

    @property
    def covered(self) -> bool:
        """Everything the client has was matched (or skipped): text is forwarded from now on."""
        return self._covered

    @property
    def matched(self) -> int:
        return self._matched

    @property
    def skipped(self) -> int:
        """How many characters at the start of the continuation's text the client was
        not given (they were its own, restated or echoed)."""
        return self._skipped

    def take(self, text: str) -> str:
        """The part of `text` the client has not seen yet."""
        if self._covered:
            return text
        new = self._placed(text) if self._restated else self._after_expected(text)
        self._skipped += len(text) - len(new)
        return new

    def _placed(self, text: str) -> str:
        """`text` while a restatement of `restated` is still possible."""
        restated, seen = self._restated, self._seen
        same = _common(text, restated[seen:])
        if seen + same == len(restated):  # all of it: restated, and skipped
            self._restated = ""
            return self._after_expected(text[same:])
        if same == len(text):
            self._seen = seen + same
            return ""  # still the client's own text: held
        held = restated[:seen] + text  # it differs: it was no restatement
        self._unplaced(seen + same)
        return self._after_expected(held)

    def _unplaced(self, agreed: int) -> None:
        """The continuation began with `agreed` characters of `restated` and then went
        another way: fine where those were the echo (a plain continuation), else it cannot
        be placed."""
        restated = self._restated
        self._restated, self._seen = "", 0
        if restated[:agreed] != self._expected[:agreed]:
            raise Diverged(agreed, len(restated), "the continuation restates part of the text it was given, "
                                                  "then differs")
        self._covered = not self._expected

    def _after_expected(self, text: str) -> str:
        if self._covered:
            return text
        expected, start = self._expected, self._matched
        same = _common(text, expected[start:])
        self._matched = start + same
        if self._matched == len(expected):
            self._covered = True
            return text[same:]
        if same == len(text):
            return ""  # all of it already with the client: held
        if self._strict:
            raise Diverged(self._matched, len(expected), "the regenerated text differs")
        self._covered = True  # a prefill's echo ends here: the rest is new
        return text[same:]

    def not_text(self, what: str) -> None:
        """Something other than plain text arrived: before the text is covered a
        regenerated answer has gone another way."""
        if self._covered:
            return
        if self._strict:
            raise Diverged(self._matched, len(self._expected), f"the regenerated answer has {what} first")
        self._settle()

    def ended(self) -> None:
        """The continuation's text (or the whole answer) ended here."""
        if not self._covered and self._strict:
            raise Diverged(self._matched, len(self._expected), "the regenerated answer is shorter")
        self._settle()

    def _settle(self) -> None:
        """A prefill's text ends here: held text that only began a restatement cannot be placed."""
        if self._restated and self._seen:
            self._unplaced(self._seen)
        self._restated = ""
        self._covered = True
