"""transformers' MusicGen decoder served by the speech-LM engine (an independent reference model).

``MusicgenAdapter`` runs a ``MusicgenForCausalLM``'s own weights through the engine's surface:
summed per-codebook embeddings + sinusoidal positions, pre-LN decoder layers whose self-attention
goes through the engine's paged KV cache, cross-attention to per-request conditioning states, and
one ``lm_head`` per codebook. MusicGen has no text vocabulary, so requests start in the audio phase
and end after ``max_audio_frames``; its delay pattern is the engine's (stream k offset by k, pad
token ``pad_token_id``, a BOS row of pads). CFG: the companion gets zeroed conditioning states,
as MusicGen's null condition.

``tiny_musicgen`` builds a small random ``MusicgenForCausalLM`` for tests and the benchmark;
``hf_generate`` runs transformers' own ``generate(guidance_scale=w)`` for the comparison.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclive.speechlm.heads import HeadLogits


def tiny_musicgen(
    num_codebooks: int = 4, vocab_size: int = 64, hidden_size: int = 64, layers: int = 2, seed: int = 0
):
    """A small randomly initialised ``MusicgenForCausalLM`` (fp32, eval mode)."""
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    cfg = MusicgenDecoderConfig(
        vocab_size=vocab_size,
        num_codebooks=num_codebooks,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        ffn_dim=4 * hidden_size,
        max_position_embeddings=512,
        pad_token_id=vocab_size,
        bos_token_id=vocab_size,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return MusicgenForCausalLM(cfg).eval()


class MusicgenAdapter:
    """Engine surface over a ``MusicgenForCausalLM`` (weights used as they are, nothing copied)."""

    has_text = False
    bos = eos = None
    bridge: tuple[int, ...] = ()

    def __init__(self, hf_model) -> None:
        self.hf = hf_model.eval()
        c = hf_model.config
        if getattr(c, "audio_channels", 1) != 1:
            raise ValueError("only mono MusicGen checkpoints are supported")
        self.n_streams = c.num_codebooks
        self.codebook_size = c.vocab_size
        self.pad = c.pad_token_id
        self.max_positions = c.max_position_embeddings
        self.kv_shape = (c.num_hidden_layers, c.num_attention_heads, c.hidden_size // c.num_attention_heads)
        self.decoder = hf_model.model.decoder

    def null_prompt(self) -> list[list[int]]:
        return [[self.pad] * self.n_streams]

    def bos_prompt(self) -> list[list[int]]:
        """MusicGen's generation start: one row of pad tokens."""
        return [[self.pad] * self.n_streams]

    def text_rows(self, tokens: list[int]) -> list[list[int]]:
        raise ValueError("MusicGen has no text vocabulary")

    def audio_row(self, codes: list[int | None]) -> list[int]:
        return [self.pad if c is None else c for c in codes]

    def embed(self, rows: torch.Tensor) -> torch.Tensor:
        return sum(emb(rows[..., k]) for k, emb in enumerate(self.decoder.embed_tokens))

    def _attend(self, mod, x, attn, layer: int) -> torch.Tensor:
        b, n, d = x.shape
        h = self.kv_shape[1]
        q = mod.q_proj(x).view(b, n, h, d // h)
        k = mod.k_proj(x).view(b, n, h, d // h)
        v = mod.v_proj(x).view(b, n, h, d // h)
        return mod.out_proj(attn(layer, q, k, v).reshape(b, n, d))

    @staticmethod
    def _cross(mod, x, states, mask) -> torch.Tensor:
        b, n, d = x.shape
        h = mod.num_heads
        q = mod.q_proj(x).view(b, n, h, d // h).transpose(1, 2)
        k = mod.k_proj(states).view(b, -1, h, d // h).transpose(1, 2)
        v = mod.v_proj(states).view(b, -1, h, d // h).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return mod.out_proj(out.transpose(1, 2).reshape(b, n, d))

    def backbone(self, x, attn, positions, cond=None) -> torch.Tensor:
        dec = self.decoder
        weights = dec.embed_positions.weights
        x = x + weights[positions.clamp_max(weights.shape[0] - 1)]
        for i, layer in enumerate(dec.layers):
            x = x + self._attend(layer.self_attn, layer.self_attn_layer_norm(x), attn, i)
            if cond is not None:
                states, mask = cond
                x = x + self._cross(layer.encoder_attn, layer.encoder_attn_layer_norm(x), states, mask)
            h = layer.activation_fn(layer.fc1(layer.final_layer_norm(x)))
            x = x + layer.fc2(h)
        return dec.layer_norm(x)

    def heads(self, h: torch.Tensor) -> HeadLogits:
        return HeadLogits(None, torch.stack([head(h) for head in self.hf.lm_heads], 1))


@torch.inference_mode()
def hf_generate(hf_model, n_frames: int, guidance_scale: float | None = None) -> torch.Tensor:
    """transformers' own greedy ``MusicgenForCausalLM.generate`` (delay pattern, CFG logits
    processor) for one unconditioned request: codes ``[S, T]``.

    Standalone ``MusicgenForCausalLM.generate`` has no null condition: with ``guidance_scale > 1`` it
    duplicates the same inputs, so both halves are equal. Passing ``encoder_hidden_states`` to it is
    not usable as a reference (in transformers 5.23 its output disagrees with the model's own forward,
    with or without cache); conditioned CFG is checked against :func:`hf_forward_loop` instead.
    """
    c = hf_model.config
    ids = torch.full((c.num_codebooks, 1), c.pad_token_id, dtype=torch.long)
    out = hf_model.generate(
        ids,
        do_sample=False,
        guidance_scale=guidance_scale,
        max_length=n_frames + c.num_codebooks,
        min_length=n_frames + c.num_codebooks,
        pad_token_id=c.pad_token_id,
        decoder_start_token_id=c.pad_token_id,
        num_return_sequences=1,
    )
    return out[0]


@torch.inference_mode()
def hf_forward_loop(
    hf_model, n_frames: int, guidance_scale: float | None, cond: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy MusicGen decoding written directly on transformers' forward (full recompute each
    step, no cache): conditioned on ``cond[L, d]``, unconditioned on zeros, logits merged per
    codebook with ``w``; the delay pattern applied by hand. Returns codes ``[S, T]`` and the merged
    logits ``[S, V]`` of every step."""
    c = hf_model.config
    s, pad = c.num_codebooks, c.pad_token_id
    rows = torch.full((s, 1), pad, dtype=torch.long)
    guided = guidance_scale is not None and guidance_scale > 1
    states = cond[None] if not guided else torch.stack([cond, torch.zeros_like(cond)])
    logs = []
    for step in range(n_frames + s - 1):
        ids = rows if not guided else torch.cat([rows, rows])
        logits = hf_model(input_ids=ids, encoder_hidden_states=states).logits[:, -1]  # [(2)S, V]
        if guided:
            logits = guidance_scale * logits[:s] + (1 - guidance_scale) * logits[s:]
        logs.append(logits)
        nxt = logits.argmax(-1)
        for k in range(s):
            if not 0 <= step - k < n_frames:
                nxt[k] = pad
        rows = torch.cat([rows, nxt[:, None]], 1)
    grid = rows[:, 1:]
    codes = torch.stack([grid[k, k : k + n_frames] for k in range(s)])
    return codes, logs
