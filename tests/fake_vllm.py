"""A fake ``vllm serve`` for the fast tests: a toy LM behind vLLM's completions API shapes.

``ToyLM`` is a deterministic second-order model over ``V`` tokens: the logits after
(prev2, prev1) are a fixed pseudo-random vector, peaked enough that top-k matters and
sometimes close enough to tie-break the biased and top-k rules differently from greedy.
``ToyBackend`` is the same model as an in-process ``Backend`` (full logits): the reference
the vLLM engine must agree with. ``FakeVLLM`` serves it over HTTP (in a thread, on 127.0.0.1)
the way vLLM 0.32 does: ``/v1/models``, ``/health``, ``/tokenize`` and ``/v1/completions``
with token-id prompts, ``prompt_logprobs`` (top-k plus the prompt token with its rank, position
0 ``null``), ``logprobs`` with ``return_tokens_as_token_ids``, ``return_token_ids``,
``stop_token_ids`` and SSE streaming. It records every request it served.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from speclive.backends.base import Backend, BackendState

V = 48
EOS = 0
STOP = {1, 2, 3}  # decoded as "."


class ToyTokenizer:
    """Token 0 ends the sequence, 1-3 are full stops, the rest are words ``wN``."""

    vocab_size = V
    eos_ids = {EOS}
    has_chat_template = True

    def decode(self, ids, skip_special_tokens=True):
        words = ["." if t in STOP else f"w{t}" for t in ids if t != EOS]
        return " ".join(words)

    def encode(self, text, add_special_tokens=False):
        return [4 + sum(map(ord, w)) % (V - 4) for w in text.split()]

    def chat(self, messages, add_generation_prompt=True):
        ids: list[int] = []
        for m in messages:
            ids += [5 if m["role"] == "system" else 6, *self.encode(m["content"]), 7]
        return ids + ([8] if add_generation_prompt else [])


class ToyLM:
    """logits(context) = table[prev2, prev1] + w * perturbation[sum(context) % P]: mostly a
    second-order chain, with a context-dependent nudge that flips near-ties when the input
    changes (so a re-translation differs from the previous one now and then, as in SSBD)."""

    def __init__(self, seed: int = 0, scale: float = 2.5, w: float = 0.6, periods: int = 7):
        rng = np.random.default_rng(seed)
        self.table = (scale * rng.standard_normal((V, V, V))).astype(np.float32)
        self.table[:, :, EOS] -= 4.0  # an answer ends now and then, not at once
        self.pert = (w * rng.standard_normal((periods, V))).astype(np.float32)

    def logits(self, ctx: list[int]) -> np.ndarray:
        prev2 = ctx[-2] if len(ctx) > 1 else 0
        return self.table[prev2, ctx[-1]] + self.pert[sum(ctx) % len(self.pert)]

    def logprobs(self, ctx: list[int]) -> np.ndarray:
        z = self.logits(ctx).astype(np.float64)
        z = z - z.max()
        return z - np.log(np.exp(z).sum())

    def rows(self, tokens: list[int]) -> list[np.ndarray]:
        """Log-probs after each token of ``tokens`` (row i: the distribution of token i+1)."""
        return [self.logprobs(tokens[: i + 1]) for i in range(len(tokens))]

    def greedy(self, prompt: list[int], n: int, stop: set[int]) -> list[int]:
        ctx, out = list(prompt), []
        for _ in range(n):
            t = int(np.argmax(self.logits(ctx)))
            out.append(t)
            ctx.append(t)
            if t in stop:
                break
        return out


class ToyBackend(Backend):
    """``ToyLM`` in process (full logits): the reference for the vLLM engine."""

    kind = "toy"

    def __init__(self, lm: ToyLM):
        self.lm, self.name = lm, "toy"
        self.tokenizer = ToyTokenizer()  # type: ignore[assignment]
        self.vocab_size, self.n_ctx = V, 4096
        super().__init__()

    def new_state(self) -> BackendState:
        return BackendState()

    def _extend(self, state, tokens, parents, last_only=False):
        parents = parents if parents is not None else list(range(-1, len(tokens) - 1))
        rows = []
        for i in range(len(tokens)):
            path, j = [], i
            while j >= 0:
                path.append(tokens[j])
                j = parents[j]
            rows.append(self.lm.logits(list(state.tokens) + path[::-1]))
        out = np.stack(rows).astype(np.float32)
        return out[-1:] if last_only else out

    def _compact(self, state, keep_idx):
        pass

    def _truncate(self, state, n):
        pass

    def fork(self, state):
        return BackendState(tokens=list(state.tokens))


class FakeVLLM:
    """The toy LM behind vLLM's HTTP API on 127.0.0.1 (a free port); ``url`` is its base."""

    def __init__(
        self, lm: ToyLM, model: str = "toy-model", max_model_len: int = 1024, max_logprobs: int = 20
    ):
        self.lm, self.model, self.max_model_len, self.max_logprobs = lm, model, max_model_len, max_logprobs
        self.requests: list[dict] = []
        #: answer every completion with this HTTP status (an overloaded or broken server)
        self.status: int | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _json(self, code: int, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health":
                    return self._json(200, {})
                if self.path == "/v1/models":
                    data = [{"id": fake.model, "object": "model", "max_model_len": fake.max_model_len}]
                    return self._json(200, {"object": "list", "data": data})
                return self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path == "/tokenize":
                    return self._json(200, {"tokens": ToyTokenizer().encode(body["prompt"])})
                if self.path != "/v1/completions":
                    return self._json(404, {"error": {"message": "not found"}})
                fake.requests.append(body)
                if fake.status is not None:
                    return self._json(fake.status, {"error": {"message": f"status {fake.status}"}})
                try:
                    result = fake.complete(body)
                except ValueError as e:
                    return self._json(400, {"error": {"message": str(e)}})
                if not body.get("stream"):
                    return self._json(200, result)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                try:
                    for t in result["choices"][0]["token_ids"]:
                        chunk = {"choices": [{"index": 0, "token_ids": [t], "text": ""}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def complete(self, body: dict) -> dict:
        prompt = [int(t) for t in body["prompt"]]
        k_prompt, k_gen = body.get("prompt_logprobs"), body.get("logprobs")
        for k in (k_prompt, k_gen):
            if k is not None and k > self.max_logprobs:
                raise ValueError(f"Requested logprobs of {k}, which is greater than max allowed: 20")
        if len(prompt) + 1 > self.max_model_len:
            raise ValueError("This model's maximum context length is exceeded")
        stop = set() if body.get("ignore_eos") else {EOS, *body.get("stop_token_ids", [])}
        out = self.lm.greedy(prompt, int(body.get("max_tokens", 16)), stop)
        choice: dict = {"index": 0, "text": ToyTokenizer().decode(out), "token_ids": out}
        if k_prompt is not None:
            rows = self.lm.rows(prompt[:-1])
            entries: list[dict | None] = [None]
            for i, row in enumerate(rows):
                order = np.argsort(-row, kind="stable")
                tok = prompt[i + 1]
                ids = [int(t) for t in order[:k_prompt]]
                if tok not in ids:
                    ids.append(tok)
                rank = {int(t): r + 1 for r, t in enumerate(order)}
                entries.append({str(t): {"logprob": float(row[t]), "rank": rank[t]} for t in ids})
            choice["prompt_logprobs"] = entries
        if k_gen is not None:
            ctx = prompt + out
            tops, own = [], []
            for j, t in enumerate(out):
                row = self.lm.logprobs(ctx[: len(prompt) + j])
                order = np.argsort(-row, kind="stable")[:k_gen]
                tops.append({f"token_id:{int(x)}": float(row[x]) for x in order})
                own.append(float(row[t]))
            choice["logprobs"] = {"top_logprobs": tops, "token_logprobs": own}
        return {"object": "text_completion", "model": self.model, "choices": [choice]}

    def completions(self) -> list[dict]:
        return list(self.requests)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
