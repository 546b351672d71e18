"""Answers translated from an upstream's API into the client's: streams and whole answers.

Four decoders (an upstream API's events into answer events, `ir.py`) and four
encoders (answer events into a client API's frames) serve all twelve ordered
pairs; docs/translation.md ("Answers") lists every decision.
"""

from .errors import error_body, error_frame, error_status
from .translator import StreamTranslator, stream_translator, translate_whole, whole_answer

__all__ = ["StreamTranslator", "error_body", "error_frame", "error_status", "stream_translator",
           "translate_whole", "whole_answer"]
