"""Where lossless SSBD (β = 0) departs from AR re-translation in a ``bench retranslate`` result:
the first differing token of each such stream and the target's top-2 logit gap there.

On the fp32 transformers backend β = 0 must equal AR token for token. On llama.cpp a k-token
verification pass moves logits slightly (quantized kernels, docs/engine.md), so an output may flip
where the top-2 gap is tiny; a flip at a clear margin would be a verification bug. The gap is
read by re-running AR one token at a time up to the divergence, as ``bench decode`` and
``bench predgen`` classify theirs (``bench.exactness.ar_logit_gap``)::

    flock /tmp/speclive-cpu.lock python benchmarks/retranslate_near_ties.py \\
        benchmarks/results/archive/retranslate-qwen0.5b-llamacpp-de-12.json

writes ``<result>-ties.md`` beside the result and exits 1 if a gap is at or above the bar.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def first_difference(ar_updates: list[list[int]], other: list[list[int]]) -> tuple[int, int] | None:
    """(update, token) of the first difference, or None when every update is identical."""
    from speclive_bench.exactness import first_divergence

    for u, (a, b) in enumerate(zip(ar_updates, other, strict=True)):
        pos = first_divergence(a, b)
        if pos is not None:
            return u, pos
    return None


def main(argv: list[str] | None = None) -> int:
    from speclive.loader import load_backend
    from speclive.sessions.retranslate import ReTranslator
    from speclive.sessions.simulate import lag_k_prefixes
    from speclive_bench.exactness import ar_logit_gap
    from speclive_bench.report import NEAR_TIE_GAP, command_line

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="a retranslate-*.json with 'ar' and 'ssbd b=0' rows")
    ap.add_argument("--method", default="ssbd b=0")
    args = ap.parse_args(argv)
    res = json.loads(args.result.read_text())
    head = res["header"]
    backend = load_backend(head["target"], head["backends"], device=head["settings"].get("device", "cpu"))
    lag_k = head["settings"]["lag_k"]
    recs = {(r["lang"], r["stream"], r["method"]): r for r in res["records"]}
    sessions: dict[str, ReTranslator] = {}  # one per language, for its prompt
    rows, streams = [], 0
    for (lang, s, method), ar in sorted(recs.items()):
        if method != "ar" or (lang, s, args.method) not in recs:
            continue
        streams += 1
        other = recs[(lang, s, args.method)]["update_ids"]
        where = first_difference(ar["update_ids"], other)
        if where is None:
            continue
        u, j = where
        a, b = ar["update_ids"][u], other[u]
        if lang not in sessions:
            sessions[lang] = ReTranslator(backend, target_lang=lang, baseline=True)
        session = sessions[lang]
        source = " ".join(lag_k_prefixes(ar["source"], lag_k)[u].split())  # as the session does
        g = ar_logit_gap(backend, session.prompt_ids(source), a, j, b[j] if j < len(b) else None)
        rows.append((lang, s, u, j, g["gap_top2"]))
    for session in sessions.values():
        session.close()
    bad = [r for r in rows if r[4] >= NEAR_TIE_GAP]
    lines = [
        f"# Where {args.method} departs from AR: {args.result.name}",
        "",
        "Reproduce with:",
        "",
        "```",
        command_line(["python", "benchmarks/retranslate_near_ties.py", str(args.result)]),
        "```",
        "",
        f"{len(rows)} of {streams} streams differ; near-tie bar {NEAR_TIE_GAP}; "
        f"{len(bad)} differ at a gap at or above it.",
        "",
        "| lang | stream | update | token | top-2 logit gap |",
        "|---|---|---|---|---|",
        *(f"| {lang} | {s} | {u} | {j} | {gap:.3f} |" for lang, s, u, j, gap in rows),
        "",
    ]
    out = args.result.with_name(args.result.stem + "-ties.md")
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
