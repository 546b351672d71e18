"""`rules.yaml`: the public contract (schema) and its resolution into routes (loader)."""

from .loader import (
    SHIPPED_RULES,
    AttemptSettings,
    Route,
    Rules,
    RulesError,
    Upstream,
    default_rules_path,
    load_rules,
)

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
