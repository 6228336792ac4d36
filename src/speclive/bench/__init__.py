"""Benchmarks: a harness shared by all of them, and one module per benchmark.

Harness (imports no benchmark module): ``report`` (run header, JSON/Markdown writers, plots),
``prompts`` (prompt sets), ``costcurve`` (verification cost curves and the bounds they set),
``exactness`` (divergence from AR and its logit gap), ``datasets``, ``peers`` (other engines).
Benchmarks: ``decode`` (with ``methods`` and ``coldrun``), ``talon``, ``predgen``, ``ssbd``,
``live``, ``asr``, ``speechlm``, ``serve``, ``scale``, ``soak``, ``reliability`` (with ``fuzz``,
``fuzz_realtime``).
"""
