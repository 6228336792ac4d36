"""speclive's benchmarks: a package apart from the product, which depends on it, never the reverse.

``speclive bench ...`` (``cli``, ``cli_asr``) is their command line.
Harness (imports no benchmark module): ``report`` (run header, JSON/Markdown writers, plots),
``prompts`` (prompt sets), ``costcurve`` (verification cost curves and the bounds they set),
``exactness`` (divergence from AR and its logit gap), ``reference`` (the greedy references),
``datasets``, ``peers`` (other engines), ``launch`` (local vLLM servers).
Benchmarks: ``decode`` (with ``methods`` and ``coldrun``), ``talon``, ``predgen``, ``ssbd``,
``live``, ``asr``, ``speechlm``, ``serve``, ``scale``, ``soak``, ``reliability`` (with ``fuzz``,
``fuzz_realtime``), ``turns``.
"""
