"""`rules.yaml`: the public contract (schema), its resolution into routes (loader) and
its problems told by file, line and field (locations)."""

from .loader import (
    SHIPPED_RULES,
    AttemptSettings,
    Route,
    Rules,
    Upstream,
    default_rules_path,
    load_rules,
)
from .locations import RulesError

__all__ = [
    "SHIPPED_RULES",
    "AttemptSettings",
    "Route",
    "Rules",
    "RulesError",
    "Upstream",
    "default_rules_path",
    "load_rules",
]
