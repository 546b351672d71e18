"""Names shared by the benchmark's modules: which paths it measures and its staging target."""

from collections.abc import Callable

PATHS = ("direct", "plain", "switchyard")
PATH_LABEL = {"direct": "direct", "plain": "plain mitmdump", "switchyard": "switchyard"}
STAGING_TARGET_MB = 300.0  # the target: switchyard's staging peak at most this much beyond plain mitmdump's

Proxies = dict[str, tuple[int | None, str | None]]  # path -> (the proxy's pid, its URL); None for direct
Progress = Callable[[str], None]  # a line for the progress log on stderr
