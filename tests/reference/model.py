"""Independent PyTorch reference of the llmtrain transformer, written from docs/model.md only.

One decoder-only transformer; `arch = "gpt2"` / `"llama"` only pick defaults for five switches
(norm, activation, position, bias, tie_embeddings) and d_ff. Parameter names are the global names
of docs/model.md ("wte.weight", "layers.0.attn.qkv.weight", ...), so a debug dump
(params.json + params.bin) loads by name.

The reference runs in float64 by default (any floating dtype works): the parity test then measures
llmtrain's fp32 rounding alone. Also here: the LR schedule, gradient clipping and AdamW of the
doc's "Training step", written out rather than taken from torch.optim.

`/usr/bin/python3 model.py` runs numeric self-checks (attention, RoPE, GQA, norms, GELU,
loss at init, AdamW/clipping against torch's own implementations).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def f32(x: float) -> float:
    """The value a C++ `float` config field holds for the decimal `x`."""
    return float(np.float32(x))


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass
class ModelCfg:
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    n_kv_heads: int = 0  # 0 = n_heads
    d_ff: int = 0  # 0 = preset default
    arch: str = "gpt2"
    # None = preset default
    norm: str | None = None  # "layernorm" | "rmsnorm"
    activation: str | None = None  # "gelu" | "swiglu"
    position: str | None = None  # "learned" | "rope"
    bias: bool | None = None
    tie_embeddings: bool | None = None
    norm_eps: float = f32(1e-5)
    rope_theta: float = f32(10000.0)
    init_std: float = f32(0.02)
    moe: "MoeCfg | None" = None  # [model.moe]; None or num_experts 0 = dense
    mla: "MlaCfg | None" = None  # model.attention = "mla" with [model.mla]; None = multi-head
    mtp_depth: int = 0  # multi-token prediction modules (DeepSeek-V3 §2.2)
    mtp_loss_weight: float = f32(0.3)  # lambda
    # [model.rope_scaling] as Hugging Face's rope_scaling dict ("rope_type": "linear" | "llama3" |
    # "yarn", "factor", ...); None = RoPE's own frequencies.
    rope_scaling: dict | None = None

    def resolved(self) -> "ModelCfg":
        """Fills the preset defaults of docs/model.md's switch table."""
        gpt2 = self.arch == "gpt2"
        if self.arch not in ("gpt2", "llama"):
            raise ValueError(f"unknown arch {self.arch!r}")
        c = replace(self)
        if c.norm is None:
            c.norm = "layernorm" if gpt2 else "rmsnorm"
        if c.activation is None:
            c.activation = "gelu" if gpt2 else "swiglu"
        if c.position is None:
            c.position = "learned" if gpt2 else "rope"
        if c.bias is None:
            c.bias = gpt2
        if c.tie_embeddings is None:
            c.tie_embeddings = gpt2
        if c.n_kv_heads == 0:
            c.n_kv_heads = c.n_heads
        if c.d_ff == 0:
            # Preset default by arch (docs/model.md lists d_ff in the arch's activation cell;
            # train/config.h: "4*d_model (gpt2), 256-multiple of 8/3*d_model (llama)").
            if gpt2:
                c.d_ff = 4 * c.d_model
            else:
                ff = -(-8 * c.d_model // 3)  # ceil(8/3 * C)
                c.d_ff = -(-ff // 256) * 256
        assert c.d_model % c.n_heads == 0, "d_model must be a multiple of n_heads"
        assert c.n_heads % c.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads"
        return c

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class MlaCfg:
    """docs/model.md, "Multi-head latent attention" (DeepSeek-V2 §2.1, V3 §2.1.1)."""

    q_lora_rank: int = 0  # 0 = a full-rank query projection
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128


@dataclass
class MoeCfg:
    """docs/model.md, "Mixture of experts"."""

    num_experts: int
    top_k: int = 2
    d_ff_expert: int = 0  # 0 = d_ff
    router: str = "softmax"  # | "sigmoid"
    normalize: bool = True
    balance: str = "aux_loss"  # | "none"
    aux_loss_coef: float = f32(0.01)
    bias_update_rate: float = f32(1e-3)
    z_loss_coef: float = 0.0
    capacity_factor: float = 0.0
    shared_experts: int = 0
    d_ff_shared: int = 0  # 0 = d_ff_expert
    first_dense_layers: int = 0
    every: int = 1
    n_group: int = 1  # group-limited routing (DeepSeek-V3)
    topk_group: int = 0  # 0 = n_group
    routed_scaling_factor: float = 1.0

    def is_moe(self, layer: int) -> bool:
        return self.num_experts > 0 and layer >= self.first_dense_layers and (layer - self.first_dense_layers) % self.every == 0


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * w + b, biased variance."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg: ModelCfg) -> nn.Module:
    return LayerNorm(cfg.d_model, cfg.norm_eps) if cfg.norm == "layernorm" else RMSNorm(cfg.d_model, cfg.norm_eps)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def yarn_m(s: float, k: float) -> float:
    """YaRN's attention temperature factor m(s, k) = 0.1 k ln s + 1 (Peng et al. 2023, §3.4, with
    DeepSeek's k)."""
    return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0


def rope_freqs(D: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """The D/2 frequencies f_i = theta^(-2i/D), scaled for a longer context, and the factor on
    cos and sin. linear: position interpolation (f / s). llama3: Meta's Llama 3.1 apply_scaling,
    by wavelength against the original context L (keep above L/high_freq_factor... divide by s
    below L/low_freq_factor, interpolate between). yarn: "NTK-by-parts" as YaRN's released code
    (and DeepSeek-V3's) computes it: the pair index where a pair turns b times over L,
    i(b) = D ln(L / (2 pi b)) / (2 ln theta), gives the ramp's ends floor(i(beta_fast)) and
    ceil(i(beta_slow)); pairs below keep f, above take f / s, linear between; cos and sin times
    m(s, mscale) / m(s, mscale_all_dim) (or m(s, 1) without them, or attention_factor)."""
    i = torch.arange(D // 2, dtype=torch.float64)
    f = theta ** (-2.0 * i / D)
    if not scaling:
        return f, 1.0
    kind, s = scaling["rope_type"], scaling["factor"]
    if kind == "linear":
        return f / s, 1.0
    L = scaling["original_max_position_embeddings"]
    if kind == "llama3":
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / f
        out = []
        for fi, w in zip(f.tolist(), wavelen.tolist()):
            if w < L / high:
                out.append(fi)
            elif w > L / low:
                out.append(fi / s)
            else:
                smooth = (L / w - low) / (high - low)
                out.append((1 - smooth) * fi / s + smooth * fi)
        return torch.tensor(out, dtype=torch.float64), 1.0
    assert kind == "yarn", kind

    def pair_of(turns):
        return D * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(pair_of(scaling.get("beta_fast", 32.0))), 0)
    hi = min(math.ceil(pair_of(scaling.get("beta_slow", 1.0))), D - 1)
    if hi == lo:
        hi += 0.001
    ramp = ((i - lo) / (hi - lo)).clamp(0, 1)  # 1: interpolated
    mag = scaling.get("attention_factor", 0.0)
    if not mag:
        ms, msa = scaling.get("mscale", 1.0), scaling.get("mscale_all_dim", 0.0)
        mag = yarn_m(s, ms) / yarn_m(s, msa) if ms and msa else yarn_m(s, 1.0)
    return f / s * ramp + f * (1 - ramp), mag


def softmax_factor(scaling: dict | None) -> float:
    """DeepSeek-V2/V3 under YaRN with mscale_all_dim: the scores' 1/sqrt(D) times
    m(s, mscale_all_dim)^2."""
    if not scaling or scaling["rope_type"] != "yarn" or not scaling.get("mscale_all_dim", 0.0):
        return 1.0
    return yarn_m(scaling["factor"], scaling["mscale_all_dim"]) ** 2


def rope_tables(T: int, D: int, theta: float, dtype, scaling: dict | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of p * f_i (rope_freqs), times the scaling's factor, shapes (T, D/2); angles in
    float64."""
    f, mag = rope_freqs(D, theta, scaling)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * f[None, :]
    return (mag * ang.cos()).to(dtype), (mag * ang.sin()).to(dtype)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on x (B, T, heads, D): pair (i, i + D/2) rotated by angle p f_i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def causal_attention(q, k, v, factor: float = 1.0):
    """q (B,T,H,D), k/v (B,T,KV,D) -> (B,T,H*D). Query head h uses kv head h // (H/KV); scores
    scaled by factor / sqrt(D)."""
    B, T, H, D = q.shape
    KV = k.shape[2]
    group = H // KV
    q = q.transpose(1, 2)  # (B,H,T,D)
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)  # head h -> kv head h // group
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)
    att = (q @ k.transpose(-2, -1)) * (factor / math.sqrt(D))  # (B,H,T,T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
    y = att @ v  # (B,H,T,D)
    return y.transpose(1, 2).reshape(B, T, H * D)


class Attention(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        self.cfg = cfg
        D = cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * D, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_heads * D, cfg.d_model, bias=cfg.bias)

    def forward(self, x, rope=None):
        B, T, _ = x.shape
        H, KV, D = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim
        qkv = self.qkv(x)  # rows [q heads | k heads | v heads]
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, KV, D), v.view(B, T, KV, D)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return self.proj(causal_attention(q, k, v, softmax_factor(self.cfg.rope_scaling)))


class LatentAttention(nn.Module):
    """Multi-head latent attention as DeepSeek-V2 §2.1 writes it: queries from a normalised
    low-rank latent (or one projection), keys and values from a normalised kv latent, each head's
    query and key a no-position part plus a RoPE part, the key's RoPE part one vector shared by
    every head (the decoupled key), softmax scale 1/sqrt(nope + rope), values v_head_dim wide."""

    def __init__(self, cfg: ModelCfg):
        super().__init__()
        a = cfg.mla
        self.a, self.H, self.cfg = a, cfg.n_heads, cfg
        C, H = cfg.d_model, cfg.n_heads
        dq = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank > 0:
            self.q_a = nn.Linear(C, a.q_lora_rank, bias=False)
            self.q_a_norm = RMSNorm(a.q_lora_rank, cfg.norm_eps)
            self.q_b = nn.Linear(a.q_lora_rank, H * dq, bias=False)
        else:
            self.q = nn.Linear(C, H * dq, bias=False)
        self.kv_a = nn.Linear(C, a.kv_lora_rank + a.qk_rope_head_dim, bias=False)
        self.kv_a_norm = RMSNorm(a.kv_lora_rank, cfg.norm_eps)
        self.kv_b = nn.Linear(a.kv_lora_rank, H * (a.qk_nope_head_dim + a.v_head_dim), bias=False)
        self.proj = nn.Linear(H * a.v_head_dim, C, bias=False)
        self.rope_keys = True  # the self-test's switch: False leaves the shared key unrotated

    def forward(self, x, rope):
        B, T, _ = x.shape
        a, H = self.a, self.H
        dn, dr, dv = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        q = self.q_b(self.q_a_norm(self.q_a(x))) if a.q_lora_rank > 0 else self.q(x)
        q_nope, q_pe = q.view(B, T, H, dn + dr).split([dn, dr], dim=-1)
        c, k_pe = self.kv_a(x).split([a.kv_lora_rank, dr], dim=-1)
        k_nope, v = self.kv_b(self.kv_a_norm(c)).view(B, T, H, dn + dv).split([dn, dv], dim=-1)
        q_pe = apply_rope(q_pe, *rope)
        k_pe = k_pe.view(B, T, 1, dr)
        if self.rope_keys:
            k_pe = apply_rope(k_pe, *rope)
        # scores (B,H,T,T): the nope parts' dot products plus the rope parts' with the shared key
        s = torch.einsum("bthd,bshd->bhts", q_nope, k_nope) + torch.einsum("bthd,bsd->bhts", q_pe, k_pe[:, :, 0])
        s = s * (softmax_factor(self.cfg.rope_scaling) / math.sqrt(dn + dr))
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        p = s.masked_fill(future, float("-inf")).softmax(dim=-1)
        o = torch.einsum("bhts,bshd->bthd", p, v)
        return self.proj(o.reshape(B, T, H * dv))


class MLP(nn.Module):
    def __init__(self, cfg: ModelCfg, d_ff: int = 0):
        super().__init__()
        self.swiglu = cfg.activation == "swiglu"
        F_ = d_ff or cfg.d_ff
        self.fc1 = nn.Linear(cfg.d_model, 2 * F_ if self.swiglu else F_, bias=cfg.bias)
        self.fc2 = nn.Linear(F_, cfg.d_model, bias=cfg.bias)

    def forward(self, x):
        u = self.fc1(x)
        if self.swiglu:
            gate, up = u.chunk(2, dim=-1)  # rows [gate | up]
            u = F.silu(gate) * up
        else:
            u = gelu_tanh(u)
        return self.fc2(u)


class MoE(nn.Module):
    """Mixture of experts as docs/model.md states it, computed densely: every expert runs on every
    token and a (token, expert) weight matrix (zero where not routed or dropped) combines them."""

    def __init__(self, cfg: ModelCfg):
        super().__init__()
        m = cfg.moe
        self.m = m
        self.swiglu = cfg.activation == "swiglu"
        E, C = m.num_experts, cfg.d_model
        self.Fe = m.d_ff_expert or cfg.d_ff
        self.router = nn.Linear(C, E, bias=False)
        self.experts = nn.Module()
        self.experts.fc1 = nn.Module()
        self.experts.fc2 = nn.Module()
        self.experts.fc1.weight = nn.Parameter(torch.empty(E, (2 if self.swiglu else 1) * self.Fe, C))
        self.experts.fc2.weight = nn.Parameter(torch.empty(E, C, self.Fe))
        if m.shared_experts > 0:
            self.shared = MLP(cfg, m.shared_experts * (m.d_ff_shared or self.Fe))
        if m.balance == "bias":  # moved by balance(), never by the optimizer
            self.router.expert_bias = nn.Parameter(torch.zeros(E), requires_grad=False)
        self.losses = []  # (aux term, z term) of each forward
        self.load = torch.zeros(E, dtype=torch.float64)  # assignments per expert since balance()

    def forward(self, x):
        B, T, C = x.shape
        m = self.m
        E, k = m.num_experts, m.top_k
        z = self.router(x)  # (B,T,E)
        p = torch.sigmoid(z) if m.router == "sigmoid" else torch.softmax(z, dim=-1)
        # top-k by score (+ the balancing bias), decreasing, ties to the lower index (stable sort)
        key = p.detach() + (self.router.expert_bias if m.balance == "bias" else 0.0)
        if m.n_group > 1 and 0 < m.topk_group < m.n_group:
            # group-limited: a group's score is the sum of its two largest keys; the topk_group
            # best groups (ties to the lower) stay open, the other experts are never picked
            grouped = key.view(B, T, m.n_group, E // m.n_group)
            gscore = grouped.topk(min(2, E // m.n_group), dim=-1).values.sum(-1)  # (B,T,G)
            gsel = torch.sort(-gscore, dim=-1, stable=True).indices[..., :m.topk_group]
            closed = torch.ones_like(gscore, dtype=torch.bool).scatter(-1, gsel, False)
            key = key.masked_fill(closed.repeat_interleave(E // m.n_group, dim=-1), float("-inf"))
        sel = torch.sort(-key, dim=-1, stable=True).indices[..., :k]  # (B,T,k)
        self.load += torch.bincount(sel.reshape(-1), minlength=E).to(torch.float64)
        w = torch.gather(p, -1, sel)
        if m.normalize:
            w = w / w.sum(-1, keepdim=True)
        w = w * m.routed_scaling_factor
        keep = torch.ones(B, T, k, dtype=torch.bool)
        if m.capacity_factor > 0:
            cap = math.ceil(m.capacity_factor * T * k / E)
            for b in range(B):
                used = [0] * E
                for j in range(k):  # rank (j, t)
                    for t in range(T):
                        e = int(sel[b, t, j])
                        keep[b, t, j] = used[e] < cap
                        used[e] += 1
        # (B,T,E) combine weights
        comb = torch.zeros(B, T, E, dtype=x.dtype).scatter_add(-1, sel, w * keep)
        h = torch.einsum("btc,efc->btef", x, self.experts.fc1.weight)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = gelu_tanh(h)
        out = torch.einsum("btef,ecf->btec", h, self.experts.fc2.weight)  # (B,T,E,C)
        y = (comb[..., None] * out).sum(2)
        if m.shared_experts > 0:
            y = y + self.shared(x)
        # router losses
        aux = torch.zeros((), dtype=x.dtype)
        if m.balance == "aux_loss":
            counts = torch.zeros(B, E, dtype=x.dtype).scatter_add(1, sel.reshape(B, T * k), torch.ones(B, T * k, dtype=x.dtype))
            f = counts / (T * k)
            q = p / p.sum(-1, keepdim=True) if m.router == "sigmoid" else p
            P = q.mean(1)  # (B,E)
            aux = m.aux_loss_coef * (E * (f * P).sum(-1)).mean()
        zl = m.z_loss_coef * (torch.logsumexp(z, dim=-1) ** 2).mean()
        self.losses.append((aux, zl))
        return y

    @torch.no_grad()
    def balance(self):
        """Aux-loss-free balancing after a step: b_e += rate * sign(mean load - load_e) over the
        step's assignments (balance = "bias"); resets the count."""
        if self.m.balance == "bias":
            mean = self.load.mean()
            self.router.expert_bias += self.m.bias_update_rate * torch.sign(mean - self.load).to(
                self.router.expert_bias.dtype)
        self.load.zero_()


class Block(nn.Module):
    def __init__(self, cfg: ModelCfg, layer: int = 0):
        super().__init__()
        self.norm_1 = make_norm(cfg)
        self.attn = LatentAttention(cfg) if cfg.mla is not None else Attention(cfg)
        self.norm_2 = make_norm(cfg)
        self.mlp = MoE(cfg) if cfg.moe is not None and cfg.moe.is_moe(layer) else MLP(cfg)

    def forward(self, x, rope=None):
        x = x + self.attn(self.norm_1(x), rope)  # dropout = 0 in the reference
        return x + self.mlp(self.norm_2(x))


class MtpModule(Block):
    """DeepSeek-V3 §2.2, depth k: h'_i = M_k [RMSNorm(Emb(t_{i+k})) ; RMSNorm(h_i^{k-1})], then a
    transformer block TRM_k, then OutHead (shared with the main model). Choices the paper leaves
    open, taken as DeepSeek's released weights and inference code (and Megatron-Core) take them:
    the embedding's half comes first in M_k (the paper writes [h ; Emb]); each module has its own
    final RMSNorm before the shared head (the paper's OutHead is the linear map alone); and
    h^{k-1} is what the previous head reads after its final norm (h^0 = the main model's
    normalised output). Its block is global layer L + k - 1 (the parameter names), an MoE block
    when [model.moe] says so of that layer."""

    def __init__(self, cfg: ModelCfg, layer: int):
        super().__init__(cfg, layer)
        self.mtp = nn.Module()
        self.mtp.enorm = make_norm(cfg)
        self.mtp.hnorm = make_norm(cfg)
        self.mtp.eh_proj = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.mtp.norm = make_norm(cfg)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        cfg = cfg.resolved()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.position == "learned":
            self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        # layers[L + k - 1] is MTP module k (its block's parameters named as a layer's).
        self.layers = nn.ModuleList([Block(cfg, l) for l in range(cfg.n_layers)] +
                                    [MtpModule(cfg, cfg.n_layers + k) for k in range(cfg.mtp_depth)])
        self.mtp_prenorm = False  # self-test: pass the hidden states on before the final norms
        self.norm_f = make_norm(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None):
        """GPT-2 init (statistically as the doc; not llmtrain's counter-based values)."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                s = std / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("attn.proj.weight", "fc2.weight")) else std
                p.normal_(0.0, s, generator=generator)
            elif name.endswith(".weight"):
                p.fill_(1.0)
            else:
                p.zero_()

    def head_weight(self):
        return self.wte.weight if self.cfg.tie_embeddings else self.lm_head.weight

    def rope(self, T, dtype):
        if self.cfg.position == "learned":
            return None
        D = self.cfg.mla.qk_rope_head_dim if self.cfg.mla is not None else self.cfg.head_dim
        return rope_tables(T, D, self.cfg.rope_theta, dtype, self.cfg.rope_scaling)

    def hidden(self, tokens):
        """tokens (B,T) int64 -> the last layer's output h (B,T,C), before the final norm."""
        B, T = tokens.shape
        assert T <= self.cfg.seq_len
        x = self.wte(tokens)
        if self.cfg.position == "learned":
            x = x + self.wpe.weight[:T]
        rope = self.rope(T, x.dtype)
        for block in self.layers[: self.cfg.n_layers]:
            x = block(x, rope)
        return x

    def forward(self, tokens):
        """tokens (B,T) int64 -> logits (B,T,V)."""
        return self.norm_f(self.hidden(tokens)) @ self.head_weight().t()

    def mtp_losses(self, h, samples):
        """The MTP losses L^k, k = 1..D, of DeepSeek-V3 eq. (24): module k runs on the T - k
        positions whose token k + 1 ahead exists (the paper's truncation h_{1:T-k}; positions
        and RoPE from 0), L^k = -1/T sum_i log P^k_i[t_{i+k+1}] over them; h: the main model's
        normalised output, then each module's."""
        B, T = samples.shape[0], samples.shape[1] - 1
        out = []
        for k in range(1, self.cfg.mtp_depth + 1):
            m = self.layers[self.cfg.n_layers + k - 1]
            n = T - k
            e = self.wte(samples[:, k : k + n])  # Emb(t_{i+k}), no learned positions
            hp = m.mtp.eh_proj(torch.cat([m.mtp.enorm(e), m.mtp.hnorm(h[:, :n])], dim=-1))
            y = m(hp, self.rope(n, hp.dtype))
            logits = m.mtp.norm(y) @ self.head_weight().t()
            h = y if self.mtp_prenorm else m.mtp.norm(y)
            targets = samples[:, k + 1 : k + 1 + n]
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
            out.append(ce / (B * T))
        return out

    def loss(self, samples):
        """samples (B, T+1): inputs the first T, targets the last T; mean CE over B*T."""
        return self.objective(samples)[0]

    def objective(self, samples):
        """(CE, router losses, MTP losses): the training objective is CE + router + lambda/D *
        sum(MTP); the router losses (aux + z of every MoE layer) are 0 for a dense model, the MTP
        list empty without multi-token prediction."""
        inputs, targets = samples[:, :-1], samples[:, 1:]
        moes = [b.mlp for b in self.layers if isinstance(b.mlp, MoE)]
        for m in moes:
            m.losses.clear()
        hidden = self.hidden(inputs)
        h = self.norm_f(hidden)
        logits = h @ self.head_weight().t()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        mtp = self.mtp_losses(hidden if self.mtp_prenorm else h, samples) if self.cfg.mtp_depth > 0 else []
        router = sum((a + z for m in moes for a, z in m.losses), torch.zeros((), dtype=ce.dtype))
        return ce, router, mtp

    # ---- debug dump ---------------------------------------------------------------------------

    def load_dump(self, dump_dir: str | Path):
        """Loads params.json + params.bin (f32 LE, offsets in elements) by global name."""
        dump_dir = Path(dump_dir)
        meta = json.loads((dump_dir / "params.json").read_text())["params"]
        data = np.fromfile(dump_dir / "params.bin", dtype="<f4")
        own = dict(self.named_parameters())
        names = [m["name"] for m in meta]
        missing = sorted(set(own) - set(names))
        extra = sorted(set(names) - set(own))
        if missing or extra:
            raise ValueError(f"dump/model parameter names differ: missing in dump {missing}, unknown in dump {extra}")
        if len(set(names)) != len(names):
            raise ValueError("duplicate parameter names in params.json")
        with torch.no_grad():
            for m in meta:
                p = own[m["name"]]
                shape = tuple(int(s) for s in m["shape"])
                if shape != tuple(p.shape):
                    raise ValueError(f"{m['name']}: dump shape {shape}, doc shape {tuple(p.shape)}")
                off, n = int(m["offset"]), int(np.prod(shape))
                if off < 0 or off + n > data.size:
                    raise ValueError(f"{m['name']}: offset {off} + {n} outside params.bin ({data.size} floats)")
                p.copy_(torch.from_numpy(data[off : off + n].reshape(shape).astype(np.float64)))
        total = sum(int(np.prod(m["shape"])) for m in meta)
        if total != data.size:
            raise ValueError(f"params.bin holds {data.size} floats, params.json describes {total}")


# --------------------------------------------------------------------------------------------
# Training step pieces (docs/model.md "Training step")
# --------------------------------------------------------------------------------------------


@dataclass
class OptCfg:
    lr: float
    min_lr: float
    warmup_steps: int
    decay: str  # "cosine" | "linear" | "constant"
    decay_steps: int
    beta1: float = f32(0.9)
    beta2: float = f32(0.95)
    eps: float = f32(1e-8)
    weight_decay: float = f32(0.1)
    grad_clip: float = f32(1.0)


def lr_at(o: OptCfg, s: int) -> float:
    """Learning rate at 1-based step s."""
    if s <= o.warmup_steps:
        return o.lr * s / o.warmup_steps
    progress = (s - o.warmup_steps) / max(1, o.decay_steps - o.warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    if o.decay == "cosine":
        return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + math.cos(math.pi * progress))
    if o.decay == "linear":
        return o.lr - (o.lr - o.min_lr) * progress
    if o.decay == "constant":
        return o.lr
    raise ValueError(f"unknown decay {o.decay!r}")


def grad_norm_and_clip(params, grad_clip: float) -> float:
    """L2 norm over all gradients (returned, pre-clip); scales by min(1, clip/(norm+1e-6))."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
    if grad_clip > 0:
        scale = min(1.0, grad_clip / (norm + 1e-6))
        for g in grads:
            g.mul_(scale)
    return norm


class AdamW:
    """Decoupled AdamW as written in the doc; decay only for 2-D parameters."""

    def __init__(self, named_params, o: OptCfg):
        self.o = o
        self.params = [(n, p) for n, p in named_params]
        self.m = {n: torch.zeros_like(p) for n, p in self.params}
        self.v = {n: torch.zeros_like(p) for n, p in self.params}
        self.t = 0

    @staticmethod
    def decays(p) -> bool:
        return p.dim() >= 2

    @torch.no_grad()
    def step_params(self):
        return [(n, p) for n, p in self.params if p.requires_grad]

    @torch.no_grad()
    def step(self, lr: float):
        o = self.o
        self.t += 1
        bc1, bc2 = 1.0 - o.beta1**self.t, 1.0 - o.beta2**self.t
        for n, p in self.step_params():
            g = p.grad
            m, v = self.m[n], self.v[n]
            m.mul_(o.beta1).add_(g, alpha=1.0 - o.beta1)
            v.mul_(o.beta2).addcmul_(g, g, value=1.0 - o.beta2)
            wd = o.weight_decay if self.decays(p) else 0.0
            update = wd * p + (m / bc1) / (torch.sqrt(v / bc2) + o.eps)
            p.sub_(lr * update)


# --------------------------------------------------------------------------------------------
# Self-checks: `/usr/bin/python3 model.py`
# --------------------------------------------------------------------------------------------


def _attention_loops(q, k, v):
    """Naive per-(b, h, t) attention with explicit softmax, kv head h // (H/KV)."""
    B, T, H, D = q.shape
    KV = k.shape[2]
    out = torch.zeros(B, T, H, D, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            kh = h // (H // KV)
            for t in range(T):
                s = torch.stack([(q[b, t, h] * k[b, j, kh]).sum() / math.sqrt(D) for j in range(t + 1)])
                w = torch.exp(s - s.max())
                w = w / w.sum()
                out[b, t, h] = sum(w[j] * v[b, j, kh] for j in range(t + 1))
    return out.reshape(B, T, H * D)


def _rope_complex(x, theta):
    """RoPE as a complex rotation of z_i = x_i + i x_{i+D/2}."""
    B, T, nh, D = x.shape
    half = D // 2
    z = torch.complex(x[..., :half], x[..., half:])
    p = torch.arange(T, dtype=torch.float64)[:, None]
    f = torch.tensor([theta ** (-2.0 * i / D) for i in range(half)], dtype=torch.float64)
    rot = torch.polar(torch.ones(T, half, dtype=torch.float64), p * f)[:, None, :]
    z = z * rot
    return torch.cat([z.real, z.imag], dim=-1)


def _close(name, a, b, tol=1e-10):
    err = (a - b).abs().max().item()
    scale = max(b.abs().max().item(), 1e-30)
    ok = err <= tol * max(1.0, scale)
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: max abs diff {err:.3e}")
    if not ok:
        raise AssertionError(name)


def self_check():
    torch.manual_seed(0)
    dt = torch.float64
    print("reference model self-checks (float64)")

    # attention vs. loops, MHA and GQA
    for H, KV in ((4, 4), (4, 2), (4, 1)):
        q = torch.randn(2, 5, H, 8, dtype=dt)
        k = torch.randn(2, 5, KV, 8, dtype=dt)
        v = torch.randn(2, 5, KV, 8, dtype=dt)
        _close(f"causal attention H={H} KV={KV} vs loops", causal_attention(q, k, v), _attention_loops(q, k, v))
    # causality: changing a future token does not change earlier outputs
    q, k, v = (torch.randn(1, 6, 2, 4, dtype=dt) for _ in range(3))
    y0 = causal_attention(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, 4:] += 1.0
    v2[:, 4:] += 1.0
    _close("causality (outputs before t=4 unchanged)", causal_attention(q, k2, v2)[:, :4], y0[:, :4])

    # RoPE vs. complex rotation; norm preserving; relative (q.k depends on p - p' only)
    x = torch.randn(2, 7, 3, 16, dtype=dt)
    cos, sin = rope_tables(7, 16, 10000.0, dt)
    _close("rope rotate-half vs complex rotation", apply_rope(x, cos, sin), _rope_complex(x, 10000.0))
    _close("rope preserves norms", apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    a, b = torch.randn(16, dtype=dt), torch.randn(16, dtype=dt)
    cos, sin = rope_tables(12, 16, 10000.0, dt)
    A = apply_rope(a.expand(1, 12, 1, 16), cos, sin)[0, :, 0]
    Bv = apply_rope(b.expand(1, 12, 1, 16), cos, sin)[0, :, 0]
    _close("rope relative: <q_p, k_p'> depends on p - p'", (A[5] * Bv[2]).sum()[None], (A[9] * Bv[6]).sum()[None])

    # activations and norms against torch's / formula versions
    u = torch.randn(1000, dtype=dt) * 3
    _close("gelu tanh vs F.gelu(approximate='tanh')", gelu_tanh(u), F.gelu(u, approximate="tanh"))
    h = torch.randn(3, 10, dtype=dt)
    ln = LayerNorm(10, 1e-5).to(dt)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    mu = h.mean(-1, keepdim=True)
    var = ((h - mu) ** 2).mean(-1, keepdim=True)
    _close("layernorm vs formula", ln(h), (h - mu) / torch.sqrt(var + 1e-5) * ln.weight + ln.bias)
    rn = RMSNorm(10, 1e-5).to(dt)
    with torch.no_grad():
        rn.weight.uniform_(0.5, 1.5)
    _close("rmsnorm vs formula", rn(h), h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-5) * rn.weight)

    # presets: names, shapes, d_ff, loss at init ~ ln V, causality of the whole model
    for arch, kv in (("gpt2", 0), ("llama", 2)):
        cfg = ModelCfg(arch=arch, vocab_size=97, n_layers=2, d_model=64, n_heads=4, n_kv_heads=kv, seq_len=32)
        m = Transformer(cfg).to(dt)
        c = m.cfg
        names = {n: tuple(p.shape) for n, p in m.named_parameters()}
        D = c.head_dim
        expect = {"wte.weight": (97, 64), "norm_f.weight": (64,),
                  "layers.1.attn.qkv.weight": ((c.n_heads + 2 * c.n_kv_heads) * D, 64),
                  "layers.1.attn.proj.weight": (64, c.n_heads * D),
                  "layers.0.mlp.fc1.weight": ((2 if arch == "llama" else 1) * c.d_ff, 64),
                  "layers.0.mlp.fc2.weight": (64, c.d_ff)}
        if arch == "gpt2":
            expect.update({"wpe.weight": (32, 64), "norm_f.bias": (64,), "layers.0.mlp.fc1.bias": (256,)})
            assert c.d_ff == 256 and "lm_head.weight" not in names and "layers.0.norm_1.bias" in names
        else:
            expect.update({"lm_head.weight": (97, 64)})
            assert c.d_ff == 256 and "wpe.weight" not in names
            assert not any(n.endswith(".bias") for n in names), "llama has no biases"
        for n, s in expect.items():
            assert names.get(n) == s, f"{arch}: {n} {names.get(n)} != {s}"
        tok = torch.randint(0, 97, (4, 33))
        loss = m.loss(tok).item()
        print(f"  ok   {arch}: {len(names)} parameter tensors, d_ff {c.d_ff}, loss at init {loss:.4f} (ln V = {math.log(97):.4f})")
        assert abs(loss - math.log(97)) < 0.05, "loss at init should be ~ ln(V)"
        logits = m(tok[:, :-1])
        tok2 = tok.clone()
        tok2[:, 20:] = (tok2[:, 20:] + 1) % 97
        _close(f"{arch}: model causal (logits before t=20 unchanged)", m(tok2[:, :-1])[:, :20], logits[:, :20])
    # 8/3 rounding: d_model 768 -> 2048 (exact), 4096 -> 10923 -> 11008 (Llama-7B)
    assert ModelCfg(arch="llama", vocab_size=1, n_layers=1, d_model=768, n_heads=12, seq_len=1).resolved().d_ff == 2048
    assert ModelCfg(arch="llama", vocab_size=1, n_layers=1, d_model=4096, n_heads=32, seq_len=1).resolved().d_ff == 11008

    # AdamW + clipping vs torch.optim.AdamW + clip_grad_norm_ (same formulas)
    cfg = ModelCfg(arch="llama", vocab_size=50, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, seq_len=8)
    m1 = Transformer(cfg).to(dt)
    m2 = Transformer(cfg).to(dt)
    m2.load_state_dict(m1.state_dict())
    o = OptCfg(lr=1e-2, min_lr=1e-3, warmup_steps=2, decay="cosine", decay_steps=6, grad_clip=0.5)
    mine = AdamW(m1.named_parameters(), o)
    decay = [p for p in m2.parameters() if p.dim() == 2]
    nodecay = [p for p in m2.parameters() if p.dim() != 2]
    ref = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    for s in range(1, 7):
        tok = torch.randint(0, 50, (3, 9))
        lr = lr_at(o, s)
        m1.zero_grad()
        m1.loss(tok).backward()
        n1 = grad_norm_and_clip(list(m1.parameters()), o.grad_clip)
        ref.zero_grad()
        m2.loss(tok).backward()
        n2 = torch.nn.utils.clip_grad_norm_(m2.parameters(), o.grad_clip).item()
        assert abs(n1 - n2) <= 1e-12 * n2, (n1, n2)
        mine.step(lr)
        for g in ref.param_groups:
            g["lr"] = lr
        ref.step()
    _close("6 AdamW+clip steps vs torch.optim.AdamW + clip_grad_norm_",
           torch.cat([p.flatten() for p in m1.parameters()]), torch.cat([p.flatten() for p in m2.parameters()]), 1e-12)
    sched = [lr_at(o, s) for s in range(1, 9)]
    assert sched[0] == o.lr / 2 and sched[1] == o.lr and abs(sched[5] - o.min_lr) < 1e-15 and sched[7] == sched[5]
    assert abs(sched[3] - (o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + math.cos(math.pi * 0.5)))) < 1e-15
    print("  ok   lr schedule (warmup, cosine, clamp after decay_steps)")
    print("all self-checks passed")


if __name__ == "__main__":
    self_check()
