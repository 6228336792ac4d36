"""``speclive bench speechlm``: the speech-LM engine on this machine (the paper's Tables 1, 2, 4).

Three parts, one process, one model (a random-initialised real transformer; shape in the header):

- **scaling**: the sequential baseline (the reference loop, one request at a time, batch 1) vs the
  continuous-batching engine with c = 1 ... 64 concurrent requests; decode tok/s and speedup;
- **cfg**: at an equal active workload of W sequences: no CFG (W requests), half the requests
  with CFG (W/3 guided + W/3 plain), all with CFG (W/2 pairs); prefill and decode tok/s,
  counted over all sequences (companions included, as the paper's engine counts them) and over
  user-visible sequences only;
- **exactness**: engine vs sequential reference on the same requests and seeds (FP32): token
  identity, first mismatch, max/mean logit RMSE (and MusicGen vs transformers when available).

Every request generates a fixed number of audio frames (``min = max``), so all systems do the
same work. Each measurement is repeated and the median kept.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from speclive.common_options import threads_option
from speclive.errors import ConfigError
from speclive.options import OptionSet, option
from speclive.speechlm import EngineCore, SamplingParams, SchedulerConfig, SpeechLM, SpeechLMConfig
from speclive.speechlm import musicgen as mg
from speclive.speechlm.delay import interleave
from speclive.speechlm.reference import reference_generate
from speclive.speechlm.vocab import encode_text
from speclive_bench import report


@dataclass
class SpeechLMBenchOptions:
    """Settings of ``bench speechlm``; each field with a flag is its command-line option."""

    #: SpeechLMConfig preset of the served model
    preset: str = option(
        "bench", "--preset", help="model shape: tiny | bench | bagpiper | opuslm", always=True
    )
    concurrency: list[int] = option(
        [1, 2, 4, 8, 16, 32, 64], "--concurrency", parse=int, help="comma-separated levels", always=True
    )
    #: prompt bytes per request
    prompt_len: int = option(32, "--prompt-len", parse=int, always=True)
    max_text_tokens: int = 8
    #: frames per request (min = max: fixed work)
    audio_frames: int = option(48, "--audio-frames", parse=int, always=True)
    seq_requests: int = 4  #: requests of the sequential baseline (its rate does not depend on c)
    cfg_scale: float = option(3.0, "--cfg-scale", parse=float, always=True)
    #: active sequences of the CFG comparison (divisible by 6)
    cfg_workload: int = option(
        48, "--cfg-workload", parse=int, help="active sequences (multiple of 6)", always=True
    )
    exact_requests: int = 8
    repeats: int = option(3, "--repeats", parse=int, always=True)
    threads: int = threads_option(1, help="torch CPU threads", always=True)
    token_budget: int = 1024
    out: Path = report.out_option()
    #: results stem speechlm-<tag> (default: the preset)
    tag: str | None = option(
        None, "--tag", help="results name: speechlm-<tag>.{json,md,png} (default: preset)", always=True
    )
    plot: bool = report.plot_option()
    command: str = ""


def _prompts(n: int, length: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz     "
    return ["".join(rng.choice(letters) for _ in range(length)) for _ in range(n)]


def _params(o: SpeechLMBenchOptions, seed: int, cfg: float | None):
    return SamplingParams(
        mode="text_audio",
        cfg=cfg,
        max_text_tokens=o.max_text_tokens,
        max_audio_frames=o.audio_frames,
        min_audio_frames=o.audio_frames,
        seed=seed,
    )


def run_sequential(model, o: SpeechLMBenchOptions) -> dict[str, Any]:
    toks = pre = dec_s = pre_s = 0.0
    for i, text in enumerate(_prompts(o.seq_requests, o.prompt_len, 1)):
        r = reference_generate(model, model.text_rows(encode_text(text)), _params(o, i, None))
        toks += r.n_forward_rows
        pre += r.n_prompt
        dec_s += r.decode_s
        pre_s += r.prefill_s
    return {"decode_tps": toks / dec_s, "prefill_tps": pre / pre_s, "tokens": toks, "seconds": dec_s + pre_s}


def run_engine(model, o: SpeechLMBenchOptions, n_plain: int, n_cfg: int, seed: int = 0) -> dict[str, Any]:
    """All requests arrive at once; returns token rates from the engine's per-step stats."""

    n = n_plain + n_cfg
    cfg = SchedulerConfig(max_num_seqs=max(2, n_plain + 2 * n_cfg), token_budget=o.token_budget)
    core = EngineCore(model, None, cfg)
    for i, text in enumerate(_prompts(n, o.prompt_len, seed)):
        guided = (i + 1) * n_cfg // n > i * n_cfg // n  # n_cfg guided requests spread evenly
        core.add_request(model.text_rows(encode_text(text)), _params(o, i, o.cfg_scale if guided else None))
    t0 = time.perf_counter()
    res = core.run_all()
    wall = time.perf_counter() - t0
    if len(res) != n or core.cache.allocator.n_used:
        raise AssertionError("engine lost a request or leaked KV blocks")
    st = core.stats
    dec_steps = [s for s in st if s.prefill_tokens == 0]
    pre_steps = [s for s in st if s.prefill_tokens > 0]
    dec_s = sum(s.seconds for s in dec_steps)
    dec = sum(s.decode_tokens for s in dec_steps)
    return {
        "requests": n,
        "guided": n_cfg,
        "sequences": n_plain + 2 * n_cfg,
        "steps": len(st),
        "decode_tps": dec / dec_s,
        "decode_tps_visible": sum(s.main_decode_tokens for s in dec_steps) / dec_s,
        "prefill_tps": sum(s.prefill_tokens for s in pre_steps)
        / max(1e-9, sum(s.seconds for s in pre_steps)),
        "e2e_tps": sum(s.decode_tokens for s in st) / wall,
        "seconds": wall,
    }


def _median_run(fn: Callable[[], dict[str, Any]], repeats: int, key: str) -> dict[str, Any]:
    runs = [fn() for _ in range(repeats)]
    runs.sort(key=lambda r: r[key])
    out = dict(runs[len(runs) // 2])
    out[f"{key}_all"] = [round(r[key], 1) for r in runs]
    return out


def run_exactness(model, o: SpeechLMBenchOptions) -> dict[str, Any]:
    """Engine vs reference on mixed requests: identical tokens? logit RMSE (paper Table 2)."""

    core = EngineCore(model, None, SchedulerConfig(token_budget=64), record_logits=True)
    work = []
    for i, text in enumerate(_prompts(o.exact_requests, o.prompt_len, 7)):
        p = SamplingParams(
            mode="text" if i % 4 == 3 else "text_audio",
            cfg=o.cfg_scale if i % 2 else None,
            max_text_tokens=o.max_text_tokens,
            max_audio_frames=16,
            min_audio_frames=4,
            seed=1000 + i,
        )
        work.append((model.text_rows(encode_text(text)), p))
        core.add_request(work[-1][0], p, request_id=str(i))
    got = core.run_all()
    return compare_runs(
        [(got[str(i)], reference_generate(model, prompt, p)) for i, (prompt, p) in enumerate(work)]
    )


def run_musicgen_exactness(o: SpeechLMBenchOptions, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Tiny random MusicGen through the engine vs transformers (greedy): ``generate(guidance_scale)``
    unconditioned, and a loop over its forward for conditioned CFG."""
    try:  # MusicGen needs a transformers build with it; the comparison is skipped without
        hf = mg.tiny_musicgen()
    except ImportError as e:  # pragma: no cover
        log(f"MusicGen comparison skipped: {e}")
        return []
    ad = mg.MusicgenAdapter(hf)
    n_frames = 16
    rows = []
    for name, conditioned in (("generate(guidance_scale=w)", False), ("forward loop, conditioned CFG", True)):
        core = EngineCore(ad, None, SchedulerConfig(n_blocks=256, block_size=8), record_logits=True)
        ws = [None, o.cfg_scale, 1.5, o.cfg_scale]
        gen = torch.Generator().manual_seed(3)
        conds = [torch.randn(4, hf.config.hidden_size, generator=gen) if conditioned else None for _ in ws]
        for i, (w, c) in enumerate(zip(ws, conds, strict=True)):
            p = SamplingParams(
                cfg=w, audio_temperature=0.0, max_audio_frames=n_frames, min_audio_frames=n_frames
            )
            core.add_request(ad.bos_prompt(), p, request_id=str(i), cond=c)
        got = core.run_all()
        pairs = []
        for i, (w, c) in enumerate(zip(ws, conds, strict=True)):
            if conditioned:
                codes, logits = mg.hf_forward_loop(hf, n_frames, w, c)
            else:
                codes, logits = mg.hf_generate(hf, n_frames, w), []
            ref_rows = _delayed_rows(codes)
            pairs.append((got[str(i)], SimpleNamespace(text_tokens=[], rows=ref_rows, logits=logits)))
        row = {"comparison": f"MusicGen (tiny random) engine vs transformers {name}", **compare_runs(pairs)}
        log(f"musicgen: {row}")
        rows.append(row)
    return rows


def _delayed_rows(codes: torch.Tensor) -> list[list[int | None]]:
    grid = interleave(codes, -1).tolist()
    return [[None if c == -1 else c for c in r] for r in grid]


def compare_runs(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    """``pairs`` of (engine result, reference result) -> identity, first mismatch, RMSE stats."""
    rmses: list[float] = []
    first: int | None = None
    identical = 0
    for got, ref in pairs:
        a = [("t", t) for t in got.text_tokens] + [("a", tuple(r)) for r in got.rows]
        b = [("t", t) for t in ref.text_tokens] + [("a", tuple(r)) for r in ref.rows]
        if a == b:
            identical += 1
        else:
            k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            first = k if first is None else min(first, k)
        for x, y in zip(got.logits, ref.logits, strict=False):
            fin = torch.isfinite(x) & torch.isfinite(y)
            rmses.append(float(((x[fin] - y[fin]) ** 2).mean().sqrt()))
    return {
        "requests": len(pairs),
        "identical": identical,
        "first_mismatch": first,
        "rmse_max": max(rmses) if rmses else None,
        "rmse_mean": statistics.fmean(rmses) if rmses else None,
        "steps_compared": len(rmses),
    }


def run_speechlm_bench(o: SpeechLMBenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    load_avg_start = report.load_avg()  # before the model is built
    torch.set_num_threads(o.threads)
    mcfg = SpeechLMConfig.preset(o.preset)
    model = SpeechLM(mcfg)
    header = _speechlm_header(o, mcfg, model, load_avg_start)
    for line in report.header_lines(header):
        log(line)
    run_engine(model, o, 4, 0)  # warm-up
    scaling, seq = _scaling(model, o, log)
    cfg_rows = _cfg_rows(model, o, log)
    exact = run_exactness(model, o)
    log(f"exactness: {exact}")
    exact_rows = [{"comparison": "engine vs sequential reference (speech LM, fp32)", **exact}]
    exact_rows += run_musicgen_exactness(o, log)
    at32 = next((r for r in scaling if r["concurrency"] == 32), None)
    targets = {
        "batching_speedup_at_32": None if at32 is None else at32["speedup"],
        "batching_target_8x_met": None if at32 is None else at32["speedup"] >= 8,
        "cfg_ratio": cfg_rows[-1]["vs_no_cfg"],
        "cfg_target_90pct_met": cfg_rows[-1]["vs_no_cfg"] >= 0.9,
    }
    return {
        "header": header,
        "sequential": seq,
        "scaling": scaling,
        "cfg": cfg_rows,
        "exactness": exact_rows,
        "targets": targets,
    }


def _speechlm_header(
    o: SpeechLMBenchOptions, mcfg: SpeechLMConfig, model: SpeechLM, load_avg_start: list[float] | None
) -> dict[str, Any]:
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "machine": report.machine_info(load_avg_start),
        "models": {
            "speech LM": f"random {o.preset}: S={mcfg.n_streams} streams x K={mcfg.codebook_size} codes, "
            f"d={mcfg.d_model}, {mcfg.n_layers} layers, {mcfg.n_heads} heads, vocab {model.layout.size}, "
            f"{n_params / 1e6:.2f}M params, fp32"
        },
        "settings": {
            "threads": o.threads,
            "prompt_len": o.prompt_len,
            "max_text_tokens": o.max_text_tokens,
            "audio_frames": o.audio_frames,
            "cfg_scale": o.cfg_scale,
            "cfg_workload": o.cfg_workload,
            "token_budget": o.token_budget,
            "repeats": o.repeats,
        },
        "command": o.command,
    }


def _scaling(
    model: SpeechLM, o: SpeechLMBenchOptions, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Engine throughput per concurrency against the sequential baseline: (rows, baseline).

    The baseline is measured right before every engine run and the speedup is the median of
    the paired ratios: on a shared CPU a baseline measured once drifts with the load."""
    seq_runs: list[dict[str, Any]] = []
    scaling = []
    for c in o.concurrency:
        pairs = []
        for _ in range(o.repeats):
            s_run = run_sequential(model, o)
            e_run = run_engine(model, o, c, 0)
            pairs.append((e_run["decode_tps"] / s_run["decode_tps"], s_run, e_run))
            seq_runs.append(s_run)
        pairs.sort(key=lambda p: p[0])
        ratio, s_mid, r = pairs[len(pairs) // 2]
        r = dict(r)
        r.update(
            concurrency=c,
            speedup=ratio,
            speedup_all=[round(p[0], 2) for p in pairs],
            sequential_tps=s_mid["decode_tps"],
        )
        scaling.append(r)
        log(f"c={c}: {r['decode_tps']:.1f} decode tok/s ({ratio:.2f}x the paired sequential run)")
    seq_runs.sort(key=lambda r: r["decode_tps"])
    seq = dict(seq_runs[len(seq_runs) // 2])
    seq["decode_tps_all"] = [round(r["decode_tps"], 1) for r in seq_runs]
    log(f"sequential baseline: {seq['decode_tps']:.1f} decode tok/s (median of {len(seq_runs)} runs)")
    return scaling, seq


def _cfg_rows(model: SpeechLM, o: SpeechLMBenchOptions, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The same workload without, half and all with classifier-free guidance."""
    w = o.cfg_workload
    cfg_rows = []
    for name, plain, guided in (("no CFG", w, 0), ("half CFG", w // 3, w // 3), ("all CFG", 0, w // 2)):
        r = _median_run(lambda p=plain, g=guided: run_engine(model, o, p, g), o.repeats, "decode_tps")
        r["setting"] = name
        cfg_rows.append(r)
        log(f"{name}: {r['decode_tps']:.1f} decode tok/s over {r['sequences']} sequences")
    base = cfg_rows[0]["decode_tps"]
    for r in cfg_rows:
        r["vs_no_cfg"] = r["decode_tps"] / base
    return cfg_rows


SCALING_COLUMNS = (
    ("concurrency", "concurrent requests", 0),
    ("decode_tps", "decode tok/s", 1),
    ("sequential_tps", "paired sequential tok/s", 1),
    ("speedup", "speedup vs sequential", 2),
    ("prefill_tps", "prefill tok/s", 1),
    ("e2e_tps", "end-to-end tok/s", 1),
    ("steps", "engine steps", 0),
)
CFG_COLUMNS = (
    ("setting", "setting", 0),
    ("requests", "requests", 0),
    ("guided", "with CFG", 0),
    ("sequences", "active sequences", 0),
    ("prefill_tps", "prefill tok/s", 1),
    ("decode_tps", "decode tok/s (all seqs)", 1),
    ("vs_no_cfg", "vs no CFG", 2),
    ("decode_tps_visible", "decode tok/s (user-visible)", 1),
)
EXACT_COLUMNS = (
    ("comparison", "comparison", 0),
    ("requests", "requests", 0),
    ("identical", "identical sequences", 0),
    ("first_mismatch", "first mismatch (step)", 0),
    ("rmse_max", "RMSE (max)", 6),
    ("rmse_mean", "RMSE (mean)", 6),
)


def _sci(row: dict[str, Any]) -> dict[str, Any]:
    """RMSEs in scientific notation (fp32 differences are ~1e-7)."""
    return {k: (f"{v:.1e}" if k.startswith("rmse") and isinstance(v, float) else v) for k, v in row.items()}


def _target_line(t: dict[str, Any]) -> str:
    sp = t["batching_speedup_at_32"]
    if sp is None:
        return "Target: >= 8x at 32 concurrent requests -> not measured (32 not among the levels)."
    return f"Target: >= 8x at 32 concurrent requests -> **{sp:.2f}x** ({'met' if sp >= 8 else 'NOT met'})."


def markdown(result: dict[str, Any]) -> str:
    lines = report.markdown_preamble("speclive speech-LM engine benchmark", result["header"])
    seq = result["sequential"]
    t = result["targets"]
    lines += [
        "## Continuous batching vs sequential",
        "",
        f"Sequential baseline (reference loop, batch 1, one request at a time): "
        f"**{seq['decode_tps']:.1f} decode tok/s** (median of all runs), {seq['prefill_tps']:.1f} prefill "
        "tok/s. It is re-measured right before every engine run; *speedup* is the median of the "
        "paired ratios, so load drift on a shared machine moves both sides alike. A token is one "
        "scheduler step of one sequence (one delayed row of S audio codes, or one text token).",
        "",
        report.md_table(SCALING_COLUMNS, result["scaling"]),
        "",
        _target_line(t),
        "",
        "## CFG at equal active workload",
        "",
        "Guided requests bring a hidden companion, so the CFG runs have fewer requests for the same number "
        "of active sequences (the paper's 256 vs 512). *All seqs* counts companion rows too (what the "
        "engine computes, the paper's accounting); *user-visible* counts main requests only.",
        "",
        report.md_table(CFG_COLUMNS, result["cfg"]),
        "",
        f"Target: CFG >= 90% of no-CFG decode throughput -> **{100 * t['cfg_ratio']:.1f}%** "
        f"({'met' if t['cfg_target_90pct_met'] else 'NOT met'}).",
        "",
        "## Numerical check (paper Table 2)",
        "",
        report.md_table(EXACT_COLUMNS, [_sci(r) for r in result["exactness"]]),
        "",
    ]
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> Path:
    plt = report._pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    sc = result["scaling"]
    cs = [r["concurrency"] for r in sc]
    ax = axes[0]
    ax.plot(cs, [r["decode_tps"] for r in sc], marker="o", label="continuous batching")
    ax.axhline(result["sequential"]["decode_tps"], color="grey", ls=":", label="sequential baseline")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("decode tok/s")
    ax2 = ax.twinx()
    ax2.plot(cs, [r["speedup"] for r in sc], color="C1", marker="x", ls="--", label="speedup")
    ax2.set_ylabel("speedup vs sequential")
    lines = ax.get_legend_handles_labels()
    extra = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + extra[0], lines[1] + extra[1], loc="upper left", fontsize=8)
    ax.set_title("decode throughput")
    cf = result["cfg"]
    names = [r["setting"] for r in cf]
    x = range(len(cf))
    axes[1].bar([i - 0.2 for i in x], [r["decode_tps"] for r in cf], 0.4, label="decode, all sequences")
    axes[1].bar(
        [i + 0.2 for i in x], [r["decode_tps_visible"] for r in cf], 0.4, label="decode, user-visible"
    )
    axes[1].set_xticks(list(x), names)
    axes[1].set_ylabel("tok/s")
    axes[1].set_title(f"CFG at {result['header']['settings']['cfg_workload']} active sequences")
    axes[1].legend(fontsize=8, loc="lower left", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out: Path, tag: str, plot_it: bool = True) -> list[Path]:
    return report.write_result_files(result, out, f"speechlm-{tag}", markdown, plot if plot_it else None)


def add_speechlm_bench_parser(sub: Any) -> None:
    """Register ``speclive bench speechlm``."""
    p = sub.add_parser("speechlm", help="speech-LM engine: continuous batching vs sequential, CFG overhead")
    OptionSet(SpeechLMBenchOptions).add_to(p)
    p.set_defaults(func=cmd_speechlm)


def cmd_speechlm(args: Any) -> int:
    import sys

    options = OptionSet(SpeechLMBenchOptions)
    o = options.build(args)
    if o.cfg_workload % 6 or o.cfg_workload < 6:
        raise ConfigError("--cfg-workload must be a positive multiple of 6")
    o.tag = o.tag or o.preset
    o.command = options.command(["speclive", "bench", "speechlm"], o)
    result = run_speechlm_bench(o, log=lambda m: print(m, file=sys.stderr))
    for path in write_outputs(result, o.out, o.tag, plot_it=o.plot):
        print(f"wrote {path}", file=sys.stderr)
    print(markdown(result))
    return 0
