"""A content view for `text/event-stream` bodies: frames with their classification."""

from __future__ import annotations

from mitmproxy import addonmanager, contentviews, http
from mitmproxy.contentviews import Contentview, Metadata

from ..frame_report import render
from ..observe import METADATA_KEY
from ..apis import APIS, api_for_path


class SwitchyardSseContentview(Contentview):
    @property
    def name(self) -> str:
        return "Switchyard SSE"

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        flow = metadata.flow
        story = flow.metadata.get(METADATA_KEY) if isinstance(flow, http.HTTPFlow) else None
        return render(data, _api_of(metadata), story if isinstance(story, dict) else None)

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        content_type = (metadata.content_type or "").lower()
        return 2.0 if content_type.startswith("text/event-stream") else -1.0


def _api_of(metadata: Metadata) -> str:
    flow = metadata.flow
    if isinstance(flow, http.HTTPFlow):
        story = flow.metadata.get(METADATA_KEY)
        if isinstance(story, dict) and story.get("api") in APIS:
            return str(story["api"])
        found = api_for_path(flow.request.path)
        if found:
            return found
    return "openai-chat"


class SseView:
    """Registers the content view while the addon is loaded."""

    def load(self, loader: addonmanager.Loader) -> None:
        contentviews.add(SwitchyardSseContentview())
