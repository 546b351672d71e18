"""Whether a continuation's text begins with what the client already has.

A regenerated answer is held until it covers every character the client got:
if it begins with exactly those, only the rest is forwarded; at the first
character that differs it is dropped.  A prefilled continuation may repeat a
little of its prefill (Anthropic refuses a prefill that ends in whitespace, so
that whitespace is sent to the client but not in the request): the repeated
part is skipped as far as it matches, and the rest forwarded.
"""

from __future__ import annotations


class Diverged(Exception):
    """The regenerated text is not the one the client has: `matched` characters agreed."""

    def __init__(self, matched: int, expected: int, why: str) -> None:
        super().__init__(f"{why} (matched {matched} of {expected} characters)")
        self.matched = matched
        self.expected = expected
        self.why = why


class Overlap:
    __slots__ = ("_expected", "_matched", "_strict", "_covered")

    def __init__(self, expected: str, *, strict: bool) -> None:
        """`strict`: the continuation must begin with all of `expected` (regenerate);
        else `expected` is skipped only as far as it matches (a prefill's echo)."""
        self._expected = expected
        self._matched = 0
        self._strict = strict
        self._covered = not expected

    @property
    def covered(self) -> bool:
        """Everything the client has was matched (or skipped): text is forwarded from now on."""
        return self._covered

    @property
    def matched(self) -> int:
        return self._matched

    def take(self, text: str) -> str:
        """The part of `text` the client has not seen yet."""
        if self._covered:
            return text
        expected, start = self._expected, self._matched
        want = expected[start:start + len(text)]
        same = 0
        limit = len(want)
        while same < limit and text[same] == want[same]:
            same += 1
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
        self._covered = True

    def ended(self) -> None:
        """The continuation's text (or the whole answer) ended here."""
        if not self._covered and self._strict:
            raise Diverged(self._matched, len(self._expected), "the regenerated answer is shorter")
        self._covered = True
