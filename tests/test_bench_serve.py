"""``speclive bench serve``'s bookkeeping: pairing, ratios, identity and the tables (no servers)."""

from __future__ import annotations

from pathlib import Path

from speclive_bench import serve as serve_bench
from speclive_bench.serve import Request, serve_markdown, summarize, summarize_voice


def _req(server, s, prompt, tokens, total, ttft=0.1, text=None, error=""):
    return Request(
        server, s, prompt, text=text or prompt.upper(), tokens=tokens, ttft_s=ttft, total_s=total, error=error
    )


def test_summary_pairs_prompts_and_reports_ratios():
    single = [
        _req("speclive", "code-edit", "a", 100, 2.0),  # 50 tok/s
        _req("llama_cpp.server", "code-edit", "a", 100, 4.0),  # 25 tok/s
        _req("speclive", "code-edit", "b", 100, 4.0, text="x"),  # 25
        _req("llama_cpp.server", "code-edit", "b", 100, 2.0, text="y"),  # 50
        _req("speclive", "code-edit", "c", 90, 1.0),  # 90
        _req("llama_cpp.server", "code-edit", "c", 90, 3.0),  # 30
        _req("speclive", "mtbench", "q", 0, 0.0, error="HTTP 503: busy"),
        _req("llama_cpp.server", "mtbench", "q", 50, 1.0),
    ]
    conc = [
        {
            "server": "speclive",
            "aggregate_tok_s": 60.0,
            "latency_p50_s": 1.0,
            "latency_p99_s": 2.0,
            "errors": 0,
        },
        {
            "server": "llama_cpp.server",
            "aggregate_tok_s": 30.0,
            "latency_p50_s": 2.0,
            "latency_p99_s": 3.0,
            "errors": 1,
        },
        {
            "server": "llama_cpp.server",
            "aggregate_tok_s": 50.0,
            "latency_p50_s": 2.0,
            "latency_p99_s": 5.0,
            "errors": 0,
        },
        {
            "server": "speclive",
            "aggregate_tok_s": 40.0,
            "latency_p50_s": 1.0,
            "latency_p99_s": 2.0,
            "errors": 0,
        },
    ]
    s = summarize(single, conc)
    ce = s["single"]["code-edit"]
    assert ce["tok_s_ratio_median"] == 2.0  # ratios 2, 0.5, 3 -> median 2 (paired per prompt)
    assert ce["speclive"]["tok_s"] == 50.0 and ce["llama_cpp.server"]["tok_s"] == 30.0
    assert (ce["identical"], ce["pairs"], ce["errors"]) == (2, 3, 0)
    mt = s["single"]["mtbench"]
    assert mt["pairs"] == 0 and mt["errors"] == 1 and mt["tok_s_ratio_median"] is None
    c = s["concurrent"]
    assert c["speclive"]["aggregate_tok_s"] == 50.0 and c["llama_cpp.server"]["aggregate_tok_s"] == 40.0
    assert c["aggregate_ratio"] == 1.25 and c["llama_cpp.server"]["errors"] == 1
    md = serve_markdown(
        {
            "header": {"settings": {"clients": 8}, "command": "speclive bench serve", "target": "m"},
            "summary": s,
        }
    )
    assert "| code-edit | speclive | 0.100 | 50.0 | 2.00 [1.00–4.00] |" in md
    assert "| code-edit | llama_cpp.server | 0.100 | 30.0 |" in md
    assert "| 2.00× [0.50–3.00] |" in md and "| 2/3 |" in md  # on the peer's row
    assert "**1.25×**" in md
    # --no-single: the concurrent table alone
    md = serve_markdown(
        {
            "header": {"settings": {"clients": 8}, "command": "speclive bench serve", "target": "m"},
            "summary": summarize([], conc),
            "concurrent": conc,
        }
    )
    assert "median TTFT" not in md and "**1.25×**" in md


def test_voice_summary_per_concurrency():
    recs = [
        {"concurrency": 1, "method": "predgen", "latency_s": 1.0, "error": ""},
        {"concurrency": 1, "method": "predgen", "latency_s": 3.0, "error": ""},
        {"concurrency": 1, "method": "cascade", "latency_s": 4.0, "error": ""},
        {"concurrency": 4, "method": "predgen", "latency_s": None, "error": "no answer audio"},
        {"concurrency": 4, "method": "cascade", "latency_s": 5.0, "error": ""},
    ]
    one, four = summarize_voice(recs)
    assert one["predgen"]["median_s"] == 2.0 and one["cascade"]["median_s"] == 4.0 and one["ratio"] == 2.0
    assert four["predgen"] == {"median_s": None, "p90_s": None, "n": 0, "errors": 1} and four["ratio"] is None


class _Axes:
    """Records what ``plot_serve`` draws."""

    def __init__(self) -> None:
        self.bars: list[list[float]] = []
        self.ticks: list[str] = []
        self.ylabel = ""

    def bar(self, xs, heights, width, label=None) -> None:
        self.bars.append(list(heights))

    def set_xticks(self, positions, labels) -> None:
        self.ticks = list(labels)

    def set_ylabel(self, text) -> None:
        self.ylabel = text

    def set_title(self, *a, **k) -> None: ...

    def legend(self, *a, **k) -> None: ...


class _Pyplot:
    def __init__(self) -> None:
        self.axes: list[_Axes] = []

    def subplots(self, figsize=None):
        self.axes.append(_Axes())
        fig = type("Fig", (), {"tight_layout": lambda s: None, "savefig": lambda s, p, dpi=None: None})()
        return fig, self.axes[-1]

    def close(self, fig) -> None: ...


def test_the_plot_shows_the_phases_that_ran(monkeypatch, tmp_path):
    """--no-single: the 8-client aggregate per server, not an empty realtime chart; 1 client
    only: one group per prompt set, no empty N-clients group."""
    from speclive_bench import report
    from speclive_bench.serve import plot_serve

    plt = _Pyplot()
    monkeypatch.setattr(report, "_pyplot", lambda: plt)
    figures = {"latency_p50_s": 1.0, "latency_p99_s": 2.0, "errors": 0}
    conc = [
        {"server": "speclive", "aggregate_tok_s": 7.0, **figures},
        {"server": "llama-server-ngram", "aggregate_tok_s": 8.0, **figures},
    ]
    header = {"settings": {"clients": 8, "peers": ["llama-server-ngram"]}, "target": "m"}
    servers = ("speclive", "llama-server-ngram")
    plot_serve(tmp_path / "a.png", {"header": header, "summary": summarize([], conc, servers)})
    ax = plt.axes[-1]
    assert ax.ylabel == "tokens / s" and ax.ticks == ["8 clients (aggregate)"]
    assert ax.bars == [[7.0], [8.0]]
    single = [_req("speclive", "mtbench", "q", 64, 2.0), _req("llama-server-ngram", "mtbench", "q", 64, 4.0)]
    header = {"settings": {"clients": 0, "peers": ["llama-server-ngram"]}, "target": "m"}
    plot_serve(tmp_path / "b.png", {"header": header, "summary": summarize(single, [], servers)})
    ax = plt.axes[-1]
    assert ax.ticks == ["mtbench, 1 client"] and [len(b) for b in ax.bars] == [1, 1]
    assert ax.bars[0][0] > ax.bars[1][0] > 0  # speclive's request took half the time


def test_fresh_servers_restart_each_server_right_before_each_of_its_passes():
    """``--fresh-servers``: every concurrent pass runs on a server started just before it, in
    the rotated order; without it the servers run all passes as they were started."""
    events: list[tuple[str, str, int]] = []

    def run_pass(name: str, k: int) -> dict:
        events.append(("pass", name, k))
        return {"server": name, "pass": k}

    def restart(name: str, k: int) -> None:
        events.append(("restart", name, k))

    rows = serve_bench.concurrent_passes(["speclive", "peer"], 3, run_pass, restart)
    assert [(r["server"], r["pass"]) for r in rows] == [
        ("speclive", 0),
        ("peer", 0),
        ("peer", 1),
        ("speclive", 1),
        ("speclive", 2),
        ("peer", 2),
    ]
    assert events[0::2] == [("restart", n, k) for _, n, k in events[1::2]]
    assert all(e[0] == "pass" for e in events[1::2])
    events.clear()
    serve_bench.concurrent_passes(["speclive", "peer"], 1, run_pass)  # at least two passes
    assert events == [
        ("pass", "speclive", 0),
        ("pass", "peer", 0),
        ("pass", "peer", 1),
        ("pass", "speclive", 1),
    ]


def test_speclive_starts_with_knowledge_private_to_the_run(tmp_path):
    """The speclive server of a run saves its drafters' knowledge in the run's own directory
    (so it starts from the priors, not from what earlier runs taught it); peers get no such
    variable."""
    import sys

    from speclive.knowledge import DIR_ENV
    from speclive.server.inproc import free_port

    assert serve_bench.server_env("llama-server-ngram", tmp_path) is None
    env = serve_bench.server_env("speclive", tmp_path)
    assert env is not None and Path(env[DIR_ENV]).parent == tmp_path
    port = free_port()
    # a stand-in server: prints the variable it was started with, answers GET /v1/models
    script = (
        "import http.server, os, sys\n"
        f"print(os.environ.get({DIR_ENV!r}), flush=True)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    srv = serve_bench.start_server(
        "speclive", [sys.executable, "-c", script], port, tmp_path, timeout=30, env=env
    )
    serve_bench.stop_server(srv)
    assert srv.log.read_text().splitlines()[0] == env[DIR_ENV]
