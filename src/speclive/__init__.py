"""speclive: speculative decoding for real-time speech + LLM applications.

One engine, many speculators: every method is a drafter, an acceptance rule, a session or a
scheduler on top of a single backend protocol (``speclive.backends.base.Backend``) and a single
draft -> verify -> commit loop (``speclive.decoder.SpeculativeDecoder``).
"""

__version__ = "0.1.0"
