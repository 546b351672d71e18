"""A stream, frame by frame, as Switchyard judged it: where the commit point was.

Pure: bytes in, text out.  Used by the mitmweb/console content view so that a
person can see which frames were held back, which frame committed, and what
each failure was worth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .apis import APIS, Decision, ErrorPolicy, FrameKind
from .sse import FrameSplitter

PREVIEW = 160

# what each kind of frame is, said under the stream's head for the kinds it has
LEGEND = {
    "keepalive": "a comment: keeps the connection open, says nothing",
    "lifecycle": "the answer starting, none of it yet: held until the first output",
    "usage": "token counts: held as lifecycle is until the first output",
    "output": "answer content: the first commits (what was held goes first)",
    "finish": "the answer's end reason: commits as output does",
    "terminal": "the API's end marker: a legitimate end",
    "empty end": "an end marker before any output: an empty answer, retried",
    "failure": "the provider's error, and what Switchyard does with it before output",
}


@dataclass(frozen=True, slots=True)
class FrameRow:
    index: int
    # keepalive | lifecycle | usage | output | finish | terminal | empty end (retryable) |
    # failure retryable/next_upstream/fatal
    kind: str
    event: str | None
    commit: bool
    detail: str
    preview: str


def _finish_reason(data: Any) -> str | None:
    """The end reason a frame carries (Chat's `finish_reason`, Anthropic's `stop_reason`,
    Gemini's `finishReason`), as `name=value`."""
    if not isinstance(data, dict):
        return None
    delta = data.get("delta")
    if data.get("type") == "message_delta" and isinstance(delta, dict) and delta.get("stop_reason"):
        return f"stop_reason={delta['stop_reason']}"
    for key, name in (("choices", "finish_reason"), ("candidates", "finishReason")):
        items = data.get(key)
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict) and item.get(name):
                return f"{name}={item[name]}"
    return None


def _usage_only(data: Any) -> bool:
    """Token counts and nothing of the answer (Chat's last chunk with `include_usage`, Gemini's `usageMetadata`)."""
    return isinstance(data, dict) and ("usage" in data or "usageMetadata" in data) and not data.get("choices") \
        and not data.get("candidates")


def _kind(kind: FrameKind, data: Any) -> tuple[str, str]:
    """What a frame is, for a person, where its class says less: a frame of output that
    carries an end reason is the answer's finish; a lifecycle frame of token counts is usage."""
    reason = _finish_reason(data) if kind in (FrameKind.OUTPUT, FrameKind.TERMINAL) else None
    if kind is FrameKind.OUTPUT and reason is not None:
        return "finish", reason
    if kind is FrameKind.LIFECYCLE and _usage_only(data):
        return "usage", ""
    return kind.value, reason or ""


def legend(rows: list[FrameRow]) -> list[str]:
    """What the kinds in `rows` mean, one line each, in the order they first appear."""
    seen = dict.fromkeys("failure" if row.kind.startswith("failure") else row.kind.removesuffix(" (retryable)")
                         for row in rows)
    return [f"  {kind:<10} {LEGEND[kind]}" for kind in seen if kind in LEGEND]


def frame_rows(data: bytes, api: str) -> list[FrameRow]:
    splitter = FrameSplitter()
    frames = splitter.feed(data) + splitter.finish()
    classifier = APIS[api].stream_classifier()
    policy = ErrorPolicy()
    rows: list[FrameRow] = []
    committed = False
    for index, frame in enumerate(frames, start=1):
        result = classifier.classify(frame.event)
        kind, detail = _kind(result.kind, frame.event.json())
        if result.kind is FrameKind.FAILURE and result.error is not None:
            decision = policy.decide(result.error)
            kind = "failure " + ("retryable" if decision is Decision.RETRY else decision.value)
            info = result.error
            detail = " ".join(f"{k}={v}" for k, v in (("status", info.status), ("code", info.code or info.type), ("message", info.message)) if v)
        elif result.kind is FrameKind.EMPTY_END:
            kind = "empty end (retryable)"
        commit = result.commits and not committed
        committed = committed or result.commits
        text = frame.raw.decode("utf-8", errors="replace").strip().replace("\r", "").replace("\n", " ⏎ ")
        rows.append(FrameRow(index, kind, result.event_type, commit, detail, text[:PREVIEW] + ("…" if len(text) > PREVIEW else "")))
    return rows


def story_lines(story: dict[str, Any]) -> list[str]:
    """A routed flow's story (its `switchyard` metadata) as text: mitmweb 12 shows no
    metadata, so the content view leads with it."""
    if "outcome" not in story:
        return []
    head = f"switchyard: route {story.get('route')}, {story.get('outcome')}"
    if story.get("answered_by"):
        head += f", answered by {story['answered_by']}"
    if story.get("suppressed_failover"):
        head += ", a failure after output forwarded (never replayed)"
    lines = [head]
    attempts = story.get("attempts")
    for attempt in attempts if isinstance(attempts, list) else []:
        if not isinstance(attempt, dict):
            continue  # metadata another addon or a hand-edited flow file changed: show what makes sense
        what = " ".join(str(attempt[k]) for k in ("status", "code", "message") if attempt.get(k))
        took = f" in {attempt['duration_s']:g}s" if isinstance(attempt.get("duration_s"), int | float) else ""
        strategy = attempt.get("continuation")  # a try to finish a cut answer
        by = f" ({strategy} after the cut)" if strategy else ""
        lines.append(f"  attempt {attempt.get('attempt')} {attempt.get('upstream')}: {attempt.get('outcome')}{by} "
                     f"({attempt.get('phase')}{took}){': ' + what if what else ''}")
    return lines + [""]


def render(data: bytes, api: str, story: dict[str, Any] | None = None) -> str:
    rows = frame_rows(data, api)
    commit_at = next((row.index for row in rows if row.commit), None)
    head = f"switchyard: {api} stream, {len(rows)} frames, " + (
        f"first output at frame {commit_at}" if commit_at else "no output"
    )
    try:
        told = story_lines(story) if story else []
    except Exception:  # metadata is anyone's to edit: a view that raised would show nothing at all
        told = []
    lines = [*told, head, *legend(rows), ""]
    for row in rows:
        marker = "▶ commit" if row.commit else ""
        lines.append(f"#{row.index:<4} {row.kind:<24} {marker:<9} {row.detail}".rstrip())
        lines.append(f"      {row.preview}")
    return "\n".join(lines)
