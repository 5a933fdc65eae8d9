"""A Llama-architecture decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP) whose KV cache
lives in vLLM-style paged blocks: per layer one tensor [2, num_blocks, block_tokens, kv_heads,
head_dim] (K and V), addressed through a request's block table.

forward() computes the logits of new tokens at positions [start, start + n) of a request whose
first `start` tokens' K/V are already in its blocks (computed earlier, or loaded from tuttid), and
writes the new tokens' K/V into the blocks. A hook runs before each layer reads the cache: the
engine's per-layer wait for a layer being loaded. Weights are random (nothing is downloadable)
and named as in Hugging Face's LlamaForCausalLM, so the same tensors load into transformers for a
cross-check. Runs on CPU (float32, CI) and CUDA (bfloat16).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaShape:
    vocab: int = 1024
    hidden: int = 512
    layers: int = 4
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 1024
    rope_theta: float = 500000.0
    eps: float = 1e-5

    @staticmethod
    def llama3_8b():
        return LlamaShape(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8,
                          head_dim=128, intermediate=14336)


def random_weights(shape: LlamaShape, seed=0, device="cpu", dtype=torch.float32):
    """HF-named weights: N(0, 1/fan_in) projections (so activations stay O(1) and attention is
    not uniform), N(0, 1) embeddings, RMSNorm gains around 1."""
    g = torch.Generator(device=device).manual_seed(seed)

    def lin(out_f, in_f):
        w = torch.empty(out_f, in_f, device=device, dtype=torch.float32)
        w.normal_(0.0, 1.0 / math.sqrt(in_f), generator=g)
        return w.to(dtype)

    def gain(n):
        w = torch.empty(n, device=device, dtype=torch.float32)
        w.normal_(1.0, 0.1, generator=g)
        return w.to(dtype)

    s = shape
    w = {"model.embed_tokens.weight": lin(s.vocab, s.hidden) * math.sqrt(s.hidden),
         "model.norm.weight": gain(s.hidden),
         "lm_head.weight": lin(s.vocab, s.hidden)}
    for i in range(s.layers):
        p = "model.layers.%d." % i
        w[p + "self_attn.q_proj.weight"] = lin(s.heads * s.head_dim, s.hidden)
        w[p + "self_attn.k_proj.weight"] = lin(s.kv_heads * s.head_dim, s.hidden)
        w[p + "self_attn.v_proj.weight"] = lin(s.kv_heads * s.head_dim, s.hidden)
        w[p + "self_attn.o_proj.weight"] = lin(s.hidden, s.heads * s.head_dim)
        w[p + "mlp.gate_proj.weight"] = lin(s.intermediate, s.hidden)
        w[p + "mlp.up_proj.weight"] = lin(s.intermediate, s.hidden)
        w[p + "mlp.down_proj.weight"] = lin(s.hidden, s.intermediate)
        w[p + "input_layernorm.weight"] = gain(s.hidden)
        w[p + "post_attention_layernorm.weight"] = gain(s.hidden)
    return w


def _rms_norm(x, weight, eps):
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


class PagedLlama:
    def __init__(self, shape: LlamaShape, weights, block_tokens=16):
        self.shape = shape
        self.w = weights
        self.block_tokens = block_tokens
        any_w = weights["model.norm.weight"]
        self.device, self.dtype = any_w.device, any_w.dtype
        inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, device=self.device,
                                                       dtype=torch.float32) / shape.head_dim))
        self.inv_freq = inv

    def new_cache(self, num_blocks):
        """A device cache: [layers, 2, num_blocks, block_tokens, kv_heads, head_dim]."""
        s = self.shape
        return torch.zeros(s.layers, 2, num_blocks, self.block_tokens, s.kv_heads, s.head_dim,
                           device=self.device, dtype=self.dtype)

    def _rope(self, positions):
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    def _slots(self, block_table, begin, end):
        pos = torch.arange(begin, end, device=self.device)
        blocks = block_table[pos // self.block_tokens]
        return blocks, pos % self.block_tokens

    def _attend(self, q, k_all, v_all, start):
        """q [n, heads, d]; k_all, v_all [total, kv_heads, d]; query i sits at start + i."""
        s = self.shape
        n, total = q.shape[0], k_all.shape[0]
        rep = s.heads // s.kv_heads
        qh = q.transpose(0, 1)                                   # [heads, n, d]
        kh = k_all.transpose(0, 1).repeat_interleave(rep, dim=0)  # [heads, total, d]
        vh = v_all.transpose(0, 1).repeat_interleave(rep, dim=0)
        if _has_sdpa():
            if start == 0:
                out = F.scaled_dot_product_attention(qh[None], kh[None], vh[None], is_causal=True)
            else:
                qpos = torch.arange(start, start + n, device=self.device)
                mask = torch.arange(total, device=self.device)[None, :] <= qpos[:, None]
                out = F.scaled_dot_product_attention(qh[None], kh[None], vh[None], attn_mask=mask)
            out = out[0]
        else:
            scores = (qh.float() @ kh.float().transpose(1, 2)) / math.sqrt(s.head_dim)
            qpos = torch.arange(start, start + n, device=self.device)
            future = torch.arange(total, device=self.device)[None, :] > qpos[:, None]
            scores.masked_fill_(future[None], float("-inf"))
            out = (scores.softmax(-1) @ vh.float()).to(q.dtype)
        return out.transpose(0, 1).reshape(n, s.heads * s.head_dim)

    @torch.no_grad()
    def forward(self, tokens, start, block_table, cache, before_layer=None, timer=None,
                last_only=False):
        """Logits (float32, [n, vocab]) of `tokens` at positions [start, start + n). Positions
        below `start` must be in the blocks of `block_table` (a list or tensor of block ids) in
        `cache` ([layers, 2, blocks, ...]) by the time before_layer(l) returns for layer l.
        timer.mark(what, l) (optional) is called at each layer's start ("layer"), around
        before_layer ("wait", "resume") and after the last layer ("end")."""
        s = self.shape
        tokens = torch.as_tensor(tokens, device=self.device)
        block_table = torch.as_tensor(block_table, device=self.device, dtype=torch.long)
        n = tokens.shape[0]
        end = start + n
        new_blocks, new_offs = self._slots(block_table, start, end)
        all_blocks, all_offs = self._slots(block_table, 0, end)
        cos, sin = self._rope(torch.arange(start, end, device=self.device))
        h = self.w["model.embed_tokens.weight"][tokens]
        mark = timer.mark if timer is not None else (lambda what, l: None)
        for l in range(s.layers):
            mark("layer", l)
            p = "model.layers.%d." % l
            x = _rms_norm(h, self.w[p + "input_layernorm.weight"], s.eps)
            q = (x @ self.w[p + "self_attn.q_proj.weight"].T).view(n, s.heads, s.head_dim)
            k = (x @ self.w[p + "self_attn.k_proj.weight"].T).view(n, s.kv_heads, s.head_dim)
            v = (x @ self.w[p + "self_attn.v_proj.weight"].T).view(n, s.kv_heads, s.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            layer_cache = cache[l]
            layer_cache[0][new_blocks, new_offs] = k
            layer_cache[1][new_blocks, new_offs] = v
            mark("wait", l)
            if before_layer is not None:
                before_layer(l)
            mark("resume", l)
            k_all = layer_cache[0][all_blocks, all_offs]
            v_all = layer_cache[1][all_blocks, all_offs]
            attn = self._attend(q, k_all, v_all, start)
            h = h + attn @ self.w[p + "self_attn.o_proj.weight"].T
            x = _rms_norm(h, self.w[p + "post_attention_layernorm.weight"], s.eps)
            gate = x @ self.w[p + "mlp.gate_proj.weight"].T
            up = x @ self.w[p + "mlp.up_proj.weight"].T
            h = h + (F.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        mark("end", s.layers)
        if last_only:  # the first token's logits only: what time to first token needs
            h = h[-1:]
        h = _rms_norm(h, self.w["model.norm.weight"], s.eps)
        return (h @ self.w["lm_head.weight"].T).float()
