"""``speclive retranslate`` and ``speclive predgen``: the two session commands.

- ``retranslate``: stream a text through an SSBD re-translation session
  (``speclive.sessions.retranslate``);
- ``predgen``: answer a prompt while the user is still speaking it, PredGen input-time
  speculation (``speclive.sessions.predictive``), optionally voiced with Piper.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from speclive.common_options import REMOTE, SESSION_LLM, VOICE, RemoteOptions
from speclive.errors import ConfigError
from speclive.loader import load_backend
from speclive.sessions.predictive import FIRST_PASS, PredGenConfig, PredictiveResponder, _parse_verifier
from speclive.sessions.retranslate import LANGUAGES, RetranslateConfig, ReTranslator
from speclive.sessions.simulate import lag_k_prefixes, simulate_user
from speclive.tts.base import Audio, write_wav
from speclive.tts.piper import PiperTTS


def load_llm(args: argparse.Namespace, remote: RemoteOptions) -> Any:
    """The LLM the options name: a ``Backend`` or a ``VLLMEngine`` (both drive the sessions)."""
    if remote.engine == "vllm":
        from speclive.engines.vllm import connect  # lazy: the vLLM client needs httpx (the serve extra)

        return connect(list(remote.vllm_urls), model=args.model, top_k=remote.vllm_top_k)
    return load_backend(args.model, args.backend, threads=args.threads, device=args.device)


def add_retranslate_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "retranslate", help="live re-translation of a growing source (SSBD: previous output as draft)"
    )
    SESSION_LLM.add_to(p)
    REMOTE.add_to(p)
    p.add_argument("--target-lang", default="de", help=f"one of: {', '.join(LANGUAGES)}")
    p.add_argument("--beta", type=float, default=0.2, help="bias towards the previous output (0 = lossless)")
    p.add_argument("--mask-k", type=int, default=3, help="hide the last k output tokens of partial updates")
    p.add_argument(
        "--display-only",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mask-k on the display only (default) or also trim the draft (--no-display-only)",
    )
    p.add_argument("--no-recycle", action="store_true", help="no recycled drafts after a divergence")
    p.add_argument(
        "--full-draft", action="store_true", help="verify the whole previous output in one pass (paper)"
    )
    p.add_argument("--baseline", action="store_true", help="plain autoregressive re-translation")
    p.add_argument("--lag-k", type=int, default=3, help="source arrives this many words per update")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("text", help="English source text")
    p.set_defaults(func=cmd_retranslate)


def cmd_retranslate(args: argparse.Namespace) -> int:
    if not args.text.strip():
        raise ConfigError("empty text: give the English source as the last argument")
    cfg = RetranslateConfig(
        target_lang=args.target_lang,
        beta=args.beta,
        mask_k=args.mask_k,
        display_only=args.display_only,
        baseline=args.baseline,
        recycle=not args.no_recycle,
        chunked=not args.full_draft,
        max_tokens=args.max_tokens,
    )
    cfg.validate()  # before the model loads
    remote = REMOTE.build(args)  # options that do not fit together fail before anything loads
    prefixes = lag_k_prefixes(args.text, args.lag_k)
    backend = load_llm(args, remote)
    session = ReTranslator(backend, cfg)
    try:
        for i, src in enumerate(prefixes):
            final = i == len(prefixes) - 1
            u = session.finish(src) if final else session.update(src)
            if not args.json:
                tag = "final" if final else f"{i + 1:>5}"
                print(f"[{tag}] {u.source}\n        -> {u.display}", flush=True)
        m = session.metrics()
    finally:
        session.close()
    if args.json:
        print(
            json.dumps(
                {
                    "updates": [
                        {"source": u.source, "output": u.output, "display": u.display}
                        for u in session.updates
                    ],
                    "final": session.updates[-1].output,
                    "metrics": m,
                    "settings": {**vars(cfg), "model": backend.name, "backend": backend.kind},
                },
                ensure_ascii=False,
            )
        )
    else:
        print(
            f"NE {m['normalized_erasure']:.2f} | A/D {100 * m['acceptance_per_draft']:.0f}% | "
            f"A/O {100 * m['accepted_per_output']:.0f}% | target forwards {m['target_forwards']} | "
            f"{m['tokens_per_second']:.1f} output tok/s",
            file=sys.stderr,
        )
    return 0


def add_predgen_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "predgen", help="voice-chat answer while the user speaks (PredGen input-time speculation)"
    )
    SESSION_LLM.add_to(p)
    REMOTE.add_to(p)
    p.add_argument("--verifier", default="greedy", help="greedy | topk:K | reflection")
    p.add_argument(
        "--first-pass",
        default="sentence",
        choices=FIRST_PASS,
        help="verify the candidate's first sentence in one pass (sentence, the paper) or in "
        "cost-curve-sized chunks (chunks)",
    )
    p.add_argument("--cpm", type=float, default=600.0, help="user speaking rate, characters per minute")
    p.add_argument("--no-tts", action="store_true", help="text only (no Piper voice)")
    VOICE.add_to(p)
    p.add_argument("--baseline", action="store_true", help="plain cascade: wait, generate, then TTS")
    p.add_argument("--lookahead", type=int, default=0, help="tokens speculated past the first sentence")
    p.add_argument("--wav", default=None, help="write the spoken answer to this WAV file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("prompt", help="what the user says")
    p.set_defaults(func=cmd_predgen)


def cmd_predgen(args: argparse.Namespace) -> int:
    import numpy as np

    if not args.prompt.strip():
        raise ConfigError("empty prompt: give what the user says as the last argument")
    if args.cpm <= 0:
        raise ConfigError(f"--cpm must be > 0, got {args.cpm}")
    _parse_verifier(args.verifier)  # fail before loading anything
    remote = REMOTE.build(args)  # options that do not fit together fail before anything loads
    tts = None
    if not args.no_tts:
        tts = PiperTTS(args.voice)
        tts.synthesize("Ready.")  # warm-up outside the measurement
    backend = load_llm(args, remote)
    cfg = PredGenConfig(
        verifier=args.verifier,
        first_pass=args.first_pass,
        max_tokens=args.max_tokens,
        lookahead=args.lookahead,
        baseline=args.baseline,
    )
    session = PredictiveResponder(backend, cfg, tts=tts)
    try:
        resp, timeline = simulate_user(session, args.prompt, args.cpm)
    finally:
        session.close()
    wait = timeline["wait_s"]
    metrics = {
        "ttfs_ms": 1000 * (wait + resp.ttfs_s),
        "nfetfs": resp.nfetfs,
        "audio_latency_ms": 1000 * (wait + resp.audio_latency_s),
        "presynth_used": resp.presynth_used,
        "wait_ms": 1000 * wait,
        "input_s": timeline["input_s"],
        "updates": len(timeline["updates"]),
        "speculation_compute_s": sum(u["compute_s"] for u in timeline["updates"]),
    }
    if args.wav and resp.audio:
        sr = resp.audio[0].sample_rate
        write_wav(args.wav, Audio(np.concatenate([a.samples for a in resp.audio]), sr, 0.0))
    if args.json:
        print(
            json.dumps(
                {"response": resp.response, "first_sentence": resp.first_sentence, "metrics": metrics},
                ensure_ascii=False,
            )
        )
    else:
        print(resp.response)
        print(
            f"TTFS {metrics['ttfs_ms']:.0f} ms | NFETFS {resp.nfetfs} | audio latency "
            f"{metrics['audio_latency_ms']:.0f} ms | pre-synthesized audio "
            f"{'used' if resp.presynth_used else 'not used'} | {metrics['updates']} partial prompts",
            file=sys.stderr,
        )
    return 0
