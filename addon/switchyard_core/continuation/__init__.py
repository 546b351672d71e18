"""Finishing an answer after a cut: the pure parts.

What plain text the client already has (`transcript`), the request that asks
for the rest (`request`), whether regenerated text begins with what was sent
(`overlap`), and continuation frames re-framed into the original stream
(`reframe`).  `attempts/continuation.py` does the I/O between them.
"""

from .overlap import Diverged, Overlap, overlap_for
from .reframe import Reframer, reframer_for
from .request import answer_input, continuation_body
from .transcript import NotContinuable, Transcript, read_transcript

STRATEGIES = ("prefill", "regenerate")

__all__ = [
    "STRATEGIES",
    "Diverged",
    "NotContinuable",
    "Overlap",
    "Reframer",
    "Transcript",
    "answer_input",
    "continuation_body",
    "overlap_for",
    "read_transcript",
    "reframer_for",
]
