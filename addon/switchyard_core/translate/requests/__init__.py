"""The request half of translation: one decoder and one encoder per API around a
shared intermediate form (`ir.py`), so that four of each serve all twelve ordered
pairs (docs/translation.md, "Requests")."""
