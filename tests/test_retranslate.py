"""SSBD re-translation session on the real SmolLM2-135M: exactness at β=0, cache reuse, metrics,
bad input. The strict token-identity checks run on the fp32 transformers backend; the same
β=0 property over many random edit sequences runs on a fake model in ``test_decoder_fake``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from speclive.acceptance import BiasedRule, GreedyRule, SourceRule
from speclive.cli import main
from speclive.errors import ConfigError, ContextOverflowError, SessionClosedError
from speclive.sessions.metrics import erasure, normalized_erasure, units
from speclive.sessions.retranslate import ReTranslator
from speclive.sessions.simulate import lag_k_prefixes, split_sentences

TEXT = (
    "The weather was cold this morning, so we stayed at home and read books by the window "
    "until the rain stopped."
)


# ---- pure helpers -----------------------------------------------------------------------------
def test_lag_k_prefixes_and_sentences():
    assert lag_k_prefixes("a b c d e f g", 3) == ["a b c", "a b c d e f", "a b c d e f g"]
    assert lag_k_prefixes("a b c", 3) == ["a b c"]
    assert lag_k_prefixes("   ", 3) == []
    assert split_sentences("Hi there. How are you? Fine!  OK.") == [
        "Hi there.",
        "How are you?",
        "Fine!",
        "OK.",
    ]
    with pytest.raises(ValueError):
        lag_k_prefixes("a", 0)


def test_normalized_erasure_by_hand():
    assert erasure(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    # displays: "a b" -> "a c d" (erase 1) -> "a c d e" (erase 0); final has 4 words
    assert normalized_erasure(["a b", "a c d", "a c d e"], "de") == pytest.approx(1 / 4)
    assert normalized_erasure(["你好", "你们好"], "zh") == pytest.approx(1 / 3)
    assert units("猫 坐", "ja") == ["猫", "坐"]
    assert normalized_erasure([], "de") == 0.0


def test_source_rule_biases_history_only():
    # node 0 = root; nodes 1 (history) and 2 (recycled) both propose token 1, which has p≈0.43
    # against the argmax 0 with p≈0.57: β=0.2 accepts it for history, greedy refuses it otherwise
    row = np.log(np.array([0.57, 0.43, 1e-9, 1e-9]))
    logits = np.stack([row, row, row])
    rule = SourceRule({"history": BiasedRule(0.2)}, default=GreedyRule())
    v = rule.accept([9, 1, 1], [-1, 0, 0], logits, sources=[None, "history", "recycled"])
    assert v.path == [0, 1]
    v = rule.accept([9, 1], [-1, 0], logits, sources=[None, "recycled"])
    assert v.path == [0] and v.bonus == 0
    assert not rule.lossless and SourceRule({}).lossless


# ---- the session on a real model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def stream():
    return lag_k_prefixes(TEXT, 3)


def _run(backend, stream, **kw):
    s = ReTranslator(backend, target_lang="de", max_tokens=32, **kw)
    for src in stream[:-1]:
        s.update(src)
    s.finish(stream[-1])
    return s


def test_beta0_is_token_identical_to_ar_retranslation(hf_smol, stream):
    ar = _run(hf_smol, stream, baseline=True)
    sd = _run(hf_smol, stream, beta=0.0)
    full = _run(hf_smol, stream, beta=0.0, chunked=False)  # the paper's single-pass draft
    assert [u.token_ids for u in full.updates] == [u.token_ids for u in ar.updates]
    full.close()
    assert [u.token_ids for u in sd.updates] == [u.token_ids for u in ar.updates]
    m_ar, m_sd = ar.metrics(), sd.metrics()
    # SmolLM2 rewrites its "translation" a lot, but recycled spans of it still save passes
    assert m_sd["accepted_per_output"] + m_sd["recycled_per_output"] > 0
    assert m_sd["target_forwards"] < m_ar["target_forwards"]
    assert m_ar["acceptance_per_draft"] == 0 and m_ar["target_forwards"] >= m_ar["output_tokens"]
    ar.close()
    sd.close()


@pytest.mark.parametrize("chunked", [True, False])
def test_unchanged_source_is_verified_in_one_pass(hf_smol, chunked):
    s = ReTranslator(hf_smol, target_lang="de", max_tokens=32, beta=0.0, chunked=chunked)
    first = s.update("Good morning, everybody.")
    again = s.update("Good morning, everybody.")  # e.g. a silence: the same partial again
    assert again.token_ids == first.token_ids
    if chunked:  # cost-curve-sized chunks (their length depends on measured costs): all accepted
        assert again.drafted == again.accepted > 0
        assert again.target_forwards < len(first.token_ids)
    else:  # the paper's single pass: the whole previous output accepted at once
        assert again.drafted == again.accepted == len(first.token_ids)
        assert again.target_forwards == 1
    s.close()


def test_biased_session_runs_and_reports_metrics(llama_smol, stream):
    s = _run(llama_smol, stream, beta=0.3, mask_k=3, display_only=True)
    m = s.metrics()
    for key in (
        "normalized_erasure",
        "acceptance_per_draft",
        "accepted_per_output",
        "target_forwards",
        "tokens_per_second",
    ):
        assert key in m
    assert m["updates"] == len(stream) and 0 < m["acceptance_per_draft"] <= 1
    # display-only mask-k: partial updates hide the last 3 output tokens, the final shows all
    last = s.updates[-1]
    assert last.final and last.display == last.output
    mid = s.updates[-2]
    assert mid.display == s.tok.decode(mid.token_ids[:-3]).strip()
    s.close()


def test_kv_cache_is_reused_across_updates(hf_smol, stream):
    s = ReTranslator(hf_smol, target_lang="de", max_tokens=32, beta=0.0)
    s.update(stream[0])
    seen: list[int] = []
    real = hf_smol.extend

    def counting(state, tokens, parents=None, last_only=False, skip=0):
        seen.append(len(tokens))
        return real(state, tokens, parents, last_only, skip)

    hf_smol.extend = counting
    try:
        u = s.update(stream[1])
    finally:
        del hf_smol.extend
    prompt = s.prompt_ids(stream[1])
    # only the changed tail of the prompt is prefilled: far less than the whole prompt
    assert seen[0] < len(prompt) // 2, (seen[0], len(prompt))
    assert sum(seen) < len(prompt) + u.new_tokens + u.target_forwards
    s.close()


def test_shrinking_and_rewritten_updates(hf_smol):
    s = ReTranslator(hf_smol, target_lang="de", max_tokens=24, beta=0.0)
    s.update("The cat sat on the warm")
    u = s.update("The dog")  # ASR revised its hypothesis
    fresh = ReTranslator(hf_smol, target_lang="de", max_tokens=24, baseline=True)
    ref = fresh.update("The dog")
    assert u.token_ids == ref.token_ids
    s.close()
    fresh.close()


def test_empty_updates_finish_twice_and_update_after_finish(hf_smol):
    s = ReTranslator(hf_smol, target_lang="de", max_tokens=8)
    u = s.update("   ")
    assert u.output == "" and u.display == "" and u.new_tokens == 0
    s.update("Hello")
    s.finish()
    assert s.updates[-1].source == "Hello" and s.updates[-1].final
    with pytest.raises(SessionClosedError):
        s.finish()
    with pytest.raises(SessionClosedError):
        s.update("Hello again")
    s.close()


def test_input_beyond_context_is_an_error_and_session_survives(llama_smol):
    s = ReTranslator(llama_smol, target_lang="de", max_tokens=8)
    with pytest.raises(ContextOverflowError):
        s.update("word " * 3000)
    u = s.update("Good morning")
    assert u.new_tokens > 0
    s.close()


def test_bad_config_is_rejected(hf_smol):
    with pytest.raises(ConfigError, match="allowed values"):
        ReTranslator(hf_smol, target_lang="xx")
    with pytest.raises(ConfigError):
        ReTranslator(hf_smol, beta=1.5)


def test_cli_json_contract(capsys):
    rc = main(
        [
            "retranslate",
            "--model",
            "smollm2-135m-instruct",
            "--target-lang",
            "de",
            "--max-tokens",
            "24",
            "--json",
            "Good morning to all of you in this room.",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"updates", "final", "metrics"}
    assert len(out["updates"]) == 3 and set(out["updates"][0]) == {"source", "output", "display"}
    assert set(out["metrics"]) >= {
        "normalized_erasure",
        "acceptance_per_draft",
        "accepted_per_output",
        "target_forwards",
        "tokens_per_second",
    }
    rc = main(["retranslate", "--target-lang", "klingon", "hello"])
    assert rc == 2 and "allowed values" in capsys.readouterr().err
