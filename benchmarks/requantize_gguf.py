"""Re-quantize a GGUF with llama.cpp's own quantizer (through llama-cpp-python's C API).

Used to ask whether another weight format gives llama.cpp a flatter verification cost curve
on this CPU:

    PYTHONPATH=src python benchmarks/requantize_gguf.py \\
        ~/.cache/speclive/models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        /tmp/qwen0.5b-q4_0.gguf q4_0

The result is a derived model, not the shipped one: re-quantizing an already quantized
tensor adds its own rounding, so answers differ from the Q4_K_M model's.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time


def main(argv: list[str] | None = None) -> int:
    import llama_cpp

    types = {t: f"LLAMA_FTYPE_MOSTLY_{t.upper()}" for t in ("q4_0", "q5_0", "q8_0")}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("dest")
    ap.add_argument("type", choices=sorted(types))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, types[args.type])
    params.allow_requantize = True
    params.nthread = args.threads
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(args.source.encode(), args.dest.encode(), ctypes.byref(params))
    if rc != 0:
        print(f"error: llama_model_quantize returned {rc}", file=sys.stderr)
        return 1
    print(f"wrote {args.dest} ({args.type}) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
