"""Names shared by the benchmark's modules: which paths it measures and its staging target."""

PATHS = ("direct", "plain", "switchyard")
PATH_LABEL = {"direct": "direct", "plain": "plain mitmdump", "switchyard": "switchyard"}
STAGING_TARGET_MB = 300.0  # the target: switchyard's staging peak at most this much beyond plain mitmdump's
