"""``speclive bench retranslate``: SSBD Tables 2-4 on this machine.

Streams English sentences (MT-Bench questions split into sentences) through re-translation
sessions as lag-k word increments and compares, side by side in one process and one run:

- ``ar``: plain autoregressive re-translation (same engine, same KV-prefix reuse),
- ``ssbd β=b`` for each β (Table 3; β=0 is lossless and must equal ``ar`` token for token on
  the fp32 backend),
- ``mask-k`` (draft trimmed) and ``display-only mask-k`` for each k at the default β (Table 4).

Every configuration of one stream runs back to back (order rotated per stream), so machine
drift hits all alike. Per configuration: NE (on the display), A/D, A/O, output tokens/s,
speedup = AR seconds / seconds, and quality of the final translation against AR's final
translation of the full input (chrF and BLEU, sacrebleu; the paper's COMET needs a hub model).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclive.common_options import backend_option, max_tokens_option, model_option
from speclive.loader import load_backend
from speclive.options import option
from speclive.sessions.retranslate import ReTranslator
from speclive.sessions.simulate import lag_k_prefixes, split_sentences
from speclive_bench import report
from speclive_bench.datasets import mtbench_questions
from speclive_bench.harness import rotated

#: sentences with fewer words re-translate in one or two updates: nothing to speculate on
MIN_WORDS, MAX_WORDS = 8, 40


@dataclass
class RetranslateBenchOptions:
    """Settings of ``bench retranslate``; each field with a flag is its command-line option."""

    model: str = model_option(always=True)
    backend: str = backend_option(always=True)
    device: str = report.hf_device_option()
    langs: Sequence[str] = option(("de", "zh", "ja"), "--langs", always=True)
    betas: Sequence[float] = option((0.0, 0.1, 0.2, 0.3, 0.4, 0.5), "--betas", parse=float, always=True)
    mask_ks: Sequence[int] = option((3, 5), "--mask-ks", parse=int, always=True)
    beta: float = option(0.2, "--beta", parse=float, help="β of the mask-k rows", always=True)
    limit: int = option(12, "--limit", parse=int, help="source sentences per language", always=True)
    lag_k: int = option(3, "--lag-k", parse=int, always=True)
    max_tokens: int = max_tokens_option(160, always=True)
    out: Path = report.out_option()
    tag: str | None = option(
        None, "--tag", help="results name: retranslate-<tag>.* (default: model-backend)", always=True
    )
    plot: bool = report.plot_option()
    command: str = ""
    configs: list[dict[str, Any]] = field(default_factory=list)


def bench_sentences(limit: int) -> list[str]:
    """English source sentences: MT-Bench first-turn questions split into sentences."""

    pool: list[str] = []
    for q in mtbench_questions():
        for s in split_sentences(q["prompt"]):
            if MIN_WORDS <= len(s.split()) <= MAX_WORDS and s not in pool:
                pool.append(s)
    if limit >= len(pool):
        return pool
    step = len(pool) / limit
    return [pool[int(i * step)] for i in range(limit)]


def configurations(opts: RetranslateBenchOptions) -> list[dict[str, Any]]:
    """(name, table, session overrides) of every method of one language."""
    cfgs: list[dict[str, Any]] = [{"name": "ar", "table": "beta", "kw": {"baseline": True, "mask_k": 0}}]
    for b in opts.betas:
        cfgs.append({"name": f"ssbd b={b:g}", "table": "beta", "kw": {"beta": b, "mask_k": 0}})
    # the paper's single full-length verification, for comparison with chunked drafting
    cfgs.append(
        {
            "name": f"full-draft b={opts.beta:g}",
            "table": "beta",
            "kw": {"beta": opts.beta, "mask_k": 0, "chunked": False},
        }
    )
    for k in opts.mask_ks:
        cfgs.append(
            {
                "name": f"mask-{k}",
                "table": "mask",
                "kw": {"beta": opts.beta, "mask_k": k, "display_only": False},
            }
        )
        cfgs.append(
            {
                "name": f"display-only mask-{k}",
                "table": "mask",
                "kw": {"beta": opts.beta, "mask_k": k, "display_only": True},
            }
        )
    return cfgs


def _quality(hyps: list[str], refs: list[str], lang: str) -> dict[str, float | None]:
    try:
        import sacrebleu
    except ImportError:  # pragma: no cover - bench extra
        return {"chrf": None, "bleu": None}
    tokenize = {"zh": "zh", "ja": "ja-mecab"}.get(lang, "13a")
    try:
        bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score
    except Exception:  # ja-mecab needs mecab-python3: fall back to character BLEU
        bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score
    return {"chrf": sacrebleu.corpus_chrf(hyps, [refs]).score, "bleu": bleu}


def run_retranslate_bench(
    opts: RetranslateBenchOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    from tqdm import tqdm

    load_avg_start = report.load_avg()  # before the model loads
    backend = load_backend(opts.model, opts.backend, device=opts.device)
    sentences = bench_sentences(opts.limit)
    cfgs = configurations(opts)
    header = {
        "machine": report.machine_info(load_avg_start),
        "target": backend.name,
        "backends": backend.kind,
        "settings": {
            "langs": list(opts.langs),
            "device": opts.device,
            "lag_k": opts.lag_k,
            "max_tokens": opts.max_tokens,
            "sentences": len(sentences),
            "beta_for_mask": opts.beta,
            "greedy": True,
        },
        "methods": [c["name"] for c in cfgs],
        "command": opts.command,
    }
    for line in report.header_lines(header):
        log(line)
    records: list[dict[str, Any]] = []
    bar = tqdm(total=len(opts.langs) * len(sentences) * len(cfgs), desc="retranslate", unit="stream")
    for lang in opts.langs:
        # warm-up: first-call allocations out of the timed runs
        w = ReTranslator(backend, target_lang=lang, max_tokens=8, baseline=True)
        w.update("Hello there.")
        w.close()
        for si, sent in enumerate(sentences):
            prefixes = lag_k_prefixes(sent, opts.lag_k)
            for c in rotated(cfgs, si):
                bar.set_postfix_str(f"{lang} #{si} {c['name']}")
                s = ReTranslator(backend, target_lang=lang, max_tokens=opts.max_tokens, **c["kw"])
                t0 = time.perf_counter()
                for p in prefixes[:-1]:
                    s.update(p)
                s.finish(prefixes[-1])
                wall = time.perf_counter() - t0
                m = s.metrics()
                records.append(
                    {
                        "lang": lang,
                        "stream": si,
                        "source": sent,
                        "method": c["name"],
                        "table": c["table"],
                        "settings": c["kw"],
                        "wall_s": wall,
                        **m,
                        "final": s.updates[-1].output,
                        "final_ids": s.updates[-1].token_ids,
                        "update_ids": [u.token_ids for u in s.updates],
                        "displays": [u.display for u in s.updates],
                    }
                )
                s.close()
                bar.update(1)
    bar.close()
    summary = summarize(records, cfgs, opts.langs)
    return {"header": header, "summary": summary, "records": records}


def summarize(records: list[dict[str, Any]], cfgs: list[dict[str, Any]], langs: Sequence[str]) -> list[dict]:
    rows = []
    for lang in langs:
        ar = {r["stream"]: r for r in records if r["lang"] == lang and r["method"] == "ar"}
        ar_secs = sum(r["seconds"] for r in ar.values())
        ar_tokens = sum(r["output_tokens"] for r in ar.values())
        for c in cfgs:
            rs = [r for r in records if r["lang"] == lang and r["method"] == c["name"]]
            if not rs:
                continue
            secs = sum(r["seconds"] for r in rs)
            out = sum(r["output_tokens"] for r in rs)
            drafted = sum(r["drafted"] for r in rs)
            accepted = sum(r["accepted"] for r in rs)
            q = _quality([r["final"] for r in rs], [ar[r["stream"]]["final"] for r in rs], lang)
            identical = sum(1 for r in rs if r["update_ids"] == ar[r["stream"]]["update_ids"])
            rows.append(
                {
                    "lang": lang,
                    "method": c["name"],
                    "table": c["table"],
                    "streams": len(rs),
                    "ne": _mean([r["normalized_erasure"] for r in rs]),
                    "a_d": accepted / drafted if drafted else None,
                    "a_o": accepted / out if out else None,
                    "tps": out / secs if secs else None,
                    "speedup": (out / secs) / (ar_tokens / ar_secs) if secs and ar_secs else None,
                    "time_speedup": ar_secs / secs if secs else None,
                    # what a reader of one stream feels: its own time, and the wait per update
                    "stream_speedup": _median(
                        [ar[r["stream"]]["seconds"] / r["seconds"] for r in rs if r["seconds"] > 0]
                    ),
                    "update_ms": 1000.0 * secs / max(1, sum(len(r["update_ids"]) for r in rs)),
                    "forwards": sum(r["target_forwards"] for r in rs),
                    "identical": identical,
                    **q,
                }
            )
    return rows


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


COLUMNS = [
    ("method", "method", 0),
    ("streams", "streams", 0),
    ("chrf", "chrF vs AR", 1),
    ("bleu", "BLEU vs AR", 1),
    ("ne", "NE", 2),
    ("a_d", "A/D", 2),
    ("a_o", "A/O", 2),
    ("tps", "output tok/s", 1),
    ("speedup", "speedup (tok/s)", 2),
    ("time_speedup", "speedup (time)", 2),
    ("stream_speedup", "median stream speedup (time)", 2),
    ("update_ms", "ms per update", 0),
    ("forwards", "target passes", 0),
    ("identical", "identical to AR", 0),
]


def markdown(result: dict[str, Any]) -> str:
    h = result["header"]
    lines = report.markdown_preamble("speclive re-translation benchmark (SSBD)", h)
    lines += [
        "Streams: MT-Bench first-turn questions split into sentences, fed as lag-k word increments. "
        "*NE* = normalized erasure of the displayed text (words; characters for zh/ja); *A/D* = accepted / "
        "drafted previous-output tokens; *A/O* = accepted previous-output tokens / all output tokens; "
        "*speedup (tok/s)* = output tokens per second over AR's (SSBD's definition), *speedup (time)* = AR "
        "seconds / seconds (all streams), *median stream speedup* = the median over streams of AR's time "
        "for that stream over this method's, *ms per update* = wall time per re-translation; "
        "quality = chrF / BLEU of the final translation against AR's final translation "
        "of the full sentence; *identical* = streams whose every update is token-identical to AR.",
        "",
    ]
    titles = {
        "beta": "bias β (Tables 2-3)",
        "mask": f"mask-k at β={h['settings']['beta_for_mask']} (Table 4)",
    }
    for lang in h["settings"]["langs"]:
        for table in ("beta", "mask"):
            rows = [
                r
                for r in result["summary"]
                if r["lang"] == lang and (r["table"] == table or r["method"] == "ar")
            ]
            if table == "mask":
                rows = [
                    r
                    for r in rows
                    if r["method"] in ("ar", f"ssbd b={h['settings']['beta_for_mask']:g}")
                    or r["table"] == "mask"
                ]
            lines += [f"## en→{lang}: {titles[table]}", "", report.md_table(COLUMNS, rows), ""]
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> Path:
    plt = report._pyplot()
    summ = result["summary"]
    langs = result["header"]["settings"]["langs"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for lang in langs:
        rows = [r for r in summ if r["lang"] == lang and r["method"].startswith("ssbd ")]
        betas = [float(r["method"].split("=")[1]) for r in rows]
        axes[0].plot(betas, [r["speedup"] for r in rows], marker="o", label=f"en→{lang}")
        axes[1].plot(betas, [r["ne"] for r in rows], marker="o", label=f"en→{lang}")
        ar = next(r for r in summ if r["lang"] == lang and r["method"] == "ar")
        axes[1].axhline(ar["ne"], ls=":", lw=0.8, color=axes[1].lines[-1].get_color())
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set(xlabel="bias β", ylabel="speedup over AR re-translation", title="SSBD speedup")
    axes[1].set(xlabel="bias β", ylabel="normalized erasure (dotted: AR)", title="flicker")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result['header']['target']} on {result['header']['backends']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out: Path, tag: str, plot_it: bool = True) -> list[Path]:
    return report.write_result_files(result, out, f"retranslate-{tag}", markdown, plot if plot_it else None)
