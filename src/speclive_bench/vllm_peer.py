"""vLLM (CPU build) peer for ``speclive bench decode``: a standalone script for the vLLM venv.

It imports only the standard library and vLLM (vLLM's pins clash with speclive's environment,
so it lives in ``.venv-vllm``, see ``benchmarks/setup_vllm.sh``). Usage::

    .venv-vllm/bin/python src/speclive_bench/vllm_peer.py --model HF_DIR \
        --method none|ngram|suffix|draft [--draft HF_DIR] --prompts-json FILE --max-tokens N

``FILE`` holds ``[{"id": str, "prompt_ids": [int, ...], "max_tokens": int (optional)}, ...]``.
Every prompt is generated greedily as a single request (one at a time: latency, like the other
methods), timed from submission to completion. The result, ``{"results": [{"id", "token_ids",
"wall_s", ...}], "startup_s", ...}``, goes to ``--out`` or stdout. Prompts whose id starts with
``warmup`` are run but not reported.

The engine runs as vLLM ships it (torch.compile on, minutes of start-up on a small CPU);
``--enforce-eager`` skips the compilation for quick checks (and slower decoding).

Environment that works on a 2-core AVX2 machine (set by ``speclive_bench.peers.VllmPeer``):
``HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1
LD_PRELOAD=<venv>/lib/libiomp5.so``; float32 (bf16 is 3-5x slower without AVX512-BF16).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, Python puts this folder first on sys.path, where our ``datasets.py`` would
# shadow Hugging Face ``datasets`` (and ``report.py`` etc. other top-level names) for vLLM and
# transformers. Drop it before anything imports them (the engine's spawned workers inherit it).
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [x for x in sys.path if str(Path(x or ".").resolve()) != _HERE]

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


def speculative_config(method: str, draft: str | None, k: int | None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for one of our method names (None = plain decoding)."""
    if method == "none":
        return None
    if method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k or 8,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k or 16}
    if method == "draft":
        if not draft:
            raise SystemExit("--method draft needs --draft HF_DIR")
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": k or 4}
    raise SystemExit(f"unknown method {method!r}")


def spec_counters(llm: Any) -> dict[str, float]:
    """Cumulative speculative-decoding counters of the engine (empty when unavailable)."""
    out: dict[str, float] = {}
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 - older/newer vLLM without this API or with stats off
        return out
    for m in metrics:
        key = SPEC_COUNTERS.get(getattr(m, "name", ""))
        if key is not None and hasattr(m, "value"):
            out[key] = out.get(key, 0.0) + float(m.value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", required=True, help="HF folder of the target (config + tokenizer + safetensors)"
    )
    p.add_argument("--method", required=True, choices=["none", "ngram", "suffix", "draft"])
    p.add_argument("--draft", default=None, help="HF folder of the draft model (--method draft)")
    p.add_argument("--prompts-json", required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--num-speculative-tokens", type=int, default=None)
    p.add_argument("--stop-ids", default="", help="comma-separated end-of-sequence token ids")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument(
        "--enforce-eager", action="store_true", help="no torch.compile: fast start-up, slower decoding"
    )
    p.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    args = p.parse_args(argv)

    from vllm import LLM, SamplingParams

    with open(args.prompts_json, encoding="utf-8") as fh:
        prompts = json.load(fh)
    spec = speculative_config(args.method, args.draft, args.num_speculative_tokens)
    kwargs: dict[str, Any] = {
        "model": args.model,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "enforce_eager": bool(args.enforce_eager),
        "disable_log_stats": False,
        "seed": 0,
    }
    if spec is not None:
        kwargs["speculative_config"] = spec
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    stop_ids = [int(x) for x in args.stop_ids.split(",") if x.strip()]

    def params(max_tokens: int) -> Any:
        return SamplingParams(
            temperature=0.0, max_tokens=max_tokens, stop_token_ids=stop_ids or None, detokenize=False
        )

    results = []
    for item in prompts:
        sp = params(int(item.get("max_tokens") or args.max_tokens))
        before = spec_counters(llm)
        t1 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": list(item["prompt_ids"])}], sp, use_tqdm=False)
        wall = time.perf_counter() - t1
        after = spec_counters(llm)
        if str(item["id"]).startswith("warmup"):
            continue
        rec: dict[str, Any] = {
            "id": item["id"],
            "token_ids": [int(t) for t in out[0].outputs[0].token_ids],
            "wall_s": wall,
            "finish_reason": out[0].outputs[0].finish_reason,
        }
        for k, v in after.items():
            rec[k] = v - before.get(k, 0.0)
        results.append(rec)

    data = {
        "method": args.method,
        "speculative_config": spec,
        "startup_s": startup,
        "enforce_eager": kwargs["enforce_eager"],
        "dtype": args.dtype,
        "results": results,
    }
    text = json.dumps(data)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
