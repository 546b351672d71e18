"""The mitmproxy-facing addons: one small class per concern."""

from .router import Router
from .rules_keeper import RulesKeeper

__all__ = ["Router", "RulesKeeper"]
