"""The benchmark behind scripts/bench.py, split by concern; bench.py is the entry point."""
