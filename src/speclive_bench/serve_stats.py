"""``speclive bench serve``'s statistics and tables: speclive against each peer, paired.

*1 client* (per prompt set): each server's median time to first token and tok/s, its request
latency p50 / p99 with 95 % bootstrap intervals; against each peer the median of per-request
tok/s ratios speclive / peer (requests paired by prompt and pass) with its bootstrap interval,
the p99 latency ratio peer / speclive (paired bootstrap) and how many texts were identical.

*N clients*: per server the mean of its passes' aggregate tok/s and latency percentiles (what
earlier results hold), its per-request latency p50 / p99 pooled over the passes with bootstrap
intervals; against each peer the aggregate throughput ratio speclive / peer (tokens over wall
time summed, passes paired) and the p99 latency ratio peer / speclive (requests paired by
prompt and pass; above 1: speclive's p99 is lower).

Records are duck-typed: 1-client requests have ``server, prompt_set, prompt, text, tokens,
ttft_s, total_s, error, tok_s`` (and ``pass_index``); N-client rows are the dicts of
``serve._concurrent`` (older rows without ``records``/``pass`` still summarize).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from speclive_bench import report
from speclive_bench.stats import paired_ratio, percentile_ci, percentile_ratio, ratio_of_sums

#: the servers of a run with the default peer
DEFAULT_SERVERS = ("speclive", "llama_cpp.server")


def _ci(t: tuple[float | None, float | None, float | None]) -> dict[str, float | None]:
    return {"value": t[0], "lo": t[1], "hi": t[2]}


def _key(r: Any) -> tuple[str, int]:
    return (r.prompt, getattr(r, "pass_index", 0))


def summarize(
    single: Sequence[Any], concurrent: list[dict[str, Any]], servers: Sequence[str] = DEFAULT_SERVERS
) -> dict[str, Any]:
    """Per prompt set the 1-client figures of every server and speclive against each peer;
    the N-client figures likewise. ``servers[0]`` is speclive, the rest its peers; the
    top-level ratio keys (``tok_s_ratio_median``, ``identical``, ``pairs``,
    ``aggregate_ratio``) are against the first peer, as in results with one peer."""
    out: dict[str, Any] = {"single": {}, "concurrent": _summarize_concurrent(concurrent, servers)}
    for s in sorted({r.prompt_set for r in single}):
        rows = [r for r in single if r.prompt_set == s and not r.error]
        by = {n: [r for r in rows if r.server == n] for n in servers}
        row: dict[str, Any] = {n: _server_single(v) for n, v in by.items()}
        row["vs"] = {p: _versus_single(by[servers[0]], by[p]) for p in servers[1:]}
        first = row["vs"].get(servers[1], {}) if len(servers) > 1 else {}
        row |= {
            "tok_s_ratio_median": (first.get("tok_s_ratio") or {}).get("median"),
            "identical": first.get("identical", 0),
            "pairs": first.get("pairs", 0),
            "errors": sum(1 for r in single if r.prompt_set == s and r.error),
        }
        out["single"][s] = row
    return out


def _server_single(v: list[Any]) -> dict[str, Any]:
    lat = [r.total_s for r in v]
    return {
        "ttft_s": statistics.median([r.ttft_s for r in v]) if v else None,
        "tok_s": statistics.median([r.tok_s for r in v]) if v else None,
        "tokens": sum(r.tokens for r in v),
        "n": len(v),
        "latency_p50_s": _ci(percentile_ci(lat, 50)),
        "latency_p99_s": _ci(percentile_ci(lat, 99)),
    }


def _versus_single(ours: list[Any], theirs: list[Any]) -> dict[str, Any]:
    """speclive against one peer over the requests both answered (paired by prompt and pass)."""
    peer = {_key(r): r for r in theirs}
    pairs = [(a, peer[_key(a)]) for a in ours if _key(a) in peer]
    return {
        "tok_s_ratio": paired_ratio([b.tok_s for _, b in pairs], [a.tok_s for a, _ in pairs]),
        "latency_p99_ratio": _ci(
            percentile_ratio([b.total_s for _, b in pairs], [a.total_s for a, _ in pairs], 99)
        ),
        "identical": sum(a.text == b.text for a, b in pairs),
        "pairs": len(pairs),
    }


def _summarize_concurrent(concurrent: list[dict[str, Any]], servers: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in servers:
        rows = [c for c in concurrent if c["server"] == n]
        if not rows:
            continue
        lat = [x["latency_s"] for c in rows for x in c.get("records", []) if not x["error"]]
        out[n] = {
            "aggregate_tok_s": statistics.mean(c["aggregate_tok_s"] for c in rows),
            "latency_p50_s": statistics.mean(c["latency_p50_s"] for c in rows),
            "latency_p99_s": statistics.mean(c["latency_p99_s"] for c in rows),
            "errors": sum(c["errors"] for c in rows),
            "passes": len(rows),
            "pooled_latency_p50_s": _ci(percentile_ci(lat, 50)),
            "pooled_latency_p99_s": _ci(percentile_ci(lat, 99)),
        }
    ours = servers[0]
    if ours in out:
        out["vs"] = {p: _versus_concurrent(concurrent, ours, p) for p in servers[1:] if p in out}
    if len(servers) > 1 and ours in out and servers[1] in out and out[servers[1]]["aggregate_tok_s"]:
        out["aggregate_ratio"] = out[ours]["aggregate_tok_s"] / out[servers[1]]["aggregate_tok_s"]
    return out


def _versus_concurrent(concurrent: list[dict[str, Any]], ours: str, peer: str) -> dict[str, Any]:
    """Aggregate ratio ours / peer (the k-th pass of each paired) and p99 ratio peer / ours."""
    a = [c for c in concurrent if c["server"] == ours]
    b = [c for c in concurrent if c["server"] == peer]
    k = min(len(a), len(b))
    agg: dict[str, float | None] = _ci((None, None, None))
    if k and all("tokens" in c and c.get("wall_s") for c in a[:k] + b[:k]):
        a_tok, a_wall = [c["tokens"] for c in a[:k]], [c["wall_s"] for c in a[:k]]
        b_tok, b_wall = [c["tokens"] for c in b[:k]], [c["wall_s"] for c in b[:k]]
        if sum(b_tok) > 0:
            agg = _ci(ratio_of_sums(a_tok, a_wall, b_tok, b_wall))

    def latencies(rows: list[dict[str, Any]]) -> dict[tuple[int, int], float]:
        return {
            (c.get("pass", i), x["prompt"]): x["latency_s"]
            for i, c in enumerate(rows)
            for x in c.get("records", [])
            if not x["error"]
        }

    la, lb = latencies(a), latencies(b)
    both = sorted(set(la) & set(lb))
    p99 = percentile_ratio([lb[x] for x in both], [la[x] for x in both], 99)
    return {"aggregate_ratio": agg, "latency_p99_ratio": _ci(p99), "pairs": len(both)}


def _x(ci: dict[str, Any] | None, digits: int = 2, unit: str = "×") -> str:
    """``1.23× [1.10–1.31]`` (empty for no value)."""
    if not ci or ci.get("value") is None:
        return ""
    text = f"{ci['value']:.{digits}f}{unit}"
    if ci.get("lo") is not None:
        text += f" [{ci['lo']:.{digits}f}–{ci['hi']:.{digits}f}]"
    return text


def single_table(summary: dict[str, Any], servers: Sequence[str]) -> list[str]:
    """The 1-client table: a row per prompt set and server; ratios on each peer's row."""
    lines = [
        "| prompt set | server | median TTFT s | median tok/s | latency p50 s [95 % CI] | latency p99 s "
        "[95 % CI] | tok/s speclive / server (paired median [95 % CI]) | p99 server / speclive "
        "| identical texts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s, row in summary.items():
        for n in servers:
            v = row.get(n)
            if v is None:
                continue
            vs = row.get("vs", {}).get(n, {})
            tr = vs.get("tok_s_ratio") or {}
            ratio = _x({"value": tr.get("median"), "lo": tr.get("lo"), "hi": tr.get("hi")})
            same = f"{vs['identical']}/{vs['pairs']}" if vs else ""
            lines.append(
                f"| {s} | {n} | {report._fmt(v['ttft_s'], 3)} | {report._fmt(v['tok_s'], 1)} | "
                f"{_x(v.get('latency_p50_s'), 2, '')} | {_x(v.get('latency_p99_s'), 2, '')} | {ratio} | "
                f"{_x(vs.get('latency_p99_ratio'))} | {same} |"
            )
    return lines


def concurrent_table(c: dict[str, Any], servers: Sequence[str], clients: int) -> list[str]:
    """The N-client table: a row per server; speclive against each peer on the peer's row."""
    if not any(n in c for n in servers):
        return []
    lines = [
        f"| {clients} clients | aggregate tok/s | latency p50 s | latency p99 s | p99 / p50 | errors "
        "| pooled p50 s [95 % CI] | pooled p99 s [95 % CI] | aggregate speclive / server "
        "| p99 server / speclive |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in servers:
        if n not in c:
            continue
        v, vs = c[n], c.get("vs", {}).get(n, {})
        p50, p99 = v["latency_p50_s"], v["latency_p99_s"]
        lines.append(
            f"| {n} | {v['aggregate_tok_s']:.1f} | {p50:.2f} | {p99:.2f} | "
            f"{p99 / p50 if p50 else float('nan'):.2f} | {v['errors']} | "
            f"{_x(v.get('pooled_latency_p50_s'), 2, '')} | {_x(v.get('pooled_latency_p99_s'), 2, '')} | "
            f"{_x(vs.get('aggregate_ratio'))} | {_x(vs.get('latency_p99_ratio'))} |"
        )
    return lines
