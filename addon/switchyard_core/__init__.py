"""Switchyard: pre-answer retry and fallback for streaming LLM calls, as a mitmproxy addon."""
