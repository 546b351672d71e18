"""The mitmproxy-facing addons: one small class per concern."""

from .comment_column import CommentColumn
from .heap import QuietCollections
from .router import Router
from .rules_keeper import RulesKeeper
from .sse_view import SseView

__all__ = ["CommentColumn", "QuietCollections", "Router", "RulesKeeper", "SseView"]
