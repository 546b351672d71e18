"""Placeholder until the classifier lands: behaves like Chat Completions' error reading."""

from __future__ import annotations

from .openai_chat import OpenAIChat


class AnthropicMessages(OpenAIChat):
    name = "anthropic-messages"
