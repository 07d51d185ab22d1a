"""Independent float64 references for RoPE (flashinfer.rope), from the spec's definitions.

Frequencies. Pair d of rotary_dim turns by angle = pos * inv_freq_d with
  plain:      inv_freq_d = rope_theta ** (-2d / rotary_dim) / rope_scale
  Llama-3.1:  f_d = rope_theta ** (-2d / rotary_dim),
              smooth = clamp((old_context_len * f_d / (2 pi) - low) / (high - low), 0, 1),
              inv_freq_d = (1 - smooth) * f_d / rope_scale + smooth * f_d
inv_freq is evaluated in float64 and rounded once to float32, and the angle is the float32
product float32(pos) * inv_freq -- the library's (and FlashInfer's) convention, which these
references reproduce exactly because at positions near 1e6 one float32 ulp of the angle is
~0.06 rad. cos/sin of that angle and the rotation are float64:
  (a, b) -> (a cos - b sin, b cos + a sin),
  pairs (d, d + rotary_dim/2) (NeoX, interleave=False) or (2d, 2d + 1) (interleave=True).

Two further formulations, used to cross-check the first on the CPU: Meta's complex multiply
(interleaved pairs as complex numbers times exp(i angle)) and vLLM's
RotaryEmbedding.forward_native with a cos/sin cache.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

__all__ = [
    "inv_freq",
    "llama31_inv_freq_meta",
    "positions_from_indptr",
    "cos_sin",
    "rotate",
    "rope",
    "rope_meta_complex",
    "build_cos_sin_cache",
    "rope_cos_sin_cache_vllm",
]


def inv_freq(rotary_dim: int, rope_scale: float = 1.0, rope_theta: float = 1e4, llama31: bool = False,
             low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, old_context_len: float = 8192.0,
             device=None) -> torch.Tensor:
    """float32 [rotary_dim // 2]: the frequency of each pair, rounded once from float64."""
    d = torch.arange(rotary_dim // 2, dtype=torch.float64, device=device)
    base = torch.pow(torch.tensor(float(rope_theta), dtype=torch.float64, device=device), -2.0 * d / rotary_dim)
    if not llama31:
        f = base / rope_scale
    else:
        smooth = (old_context_len * base / (2 * math.pi) - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smooth = smooth.clamp(0.0, 1.0)
        f = (1 - smooth) * base / rope_scale + smooth * base
    return f.to(torch.float32)


def llama31_inv_freq_meta(rotary_dim: int, rope_scale: float, rope_theta: float, low_freq_factor: float,
                          high_freq_factor: float, old_context_len: float) -> torch.Tensor:
    """Meta's apply_scaling (by wavelength, three regions), float64 -- a cross-check of inv_freq."""
    freqs = 1.0 / (rope_theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    low_wavelen = old_context_len / low_freq_factor
    high_wavelen = old_context_len / high_freq_factor
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / rope_scale)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * f / rope_scale + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def positions_from_indptr(indptr: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """int64 [nnz]: token t of segment b has position offsets[b] + t - indptr[b]."""
    ip = indptr.to("cpu", torch.int64).tolist()
    off = offsets.to("cpu", torch.int64).tolist()
    pos = []
    for b in range(len(off)):
        pos.extend(off[b] + t for t in range(ip[b + 1] - ip[b]))
    return torch.tensor(pos, dtype=torch.int64, device=indptr.device)


def cos_sin(pos: torch.Tensor, freq32: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """float64 [nnz, rotary_dim // 2] cos and sin of the float32 angle float32(pos) * freq32."""
    angle = pos.to(freq32.device, torch.float32)[:, None] * freq32[None, :]  # one float32 rounding
    angle = angle.to(torch.float64)
    return torch.cos(angle), torch.sin(angle)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, interleave: bool) -> torch.Tensor:
    """float64 copy of x [nnz, heads, head_dim] with its first rotary_dim features rotated;
    cos/sin [nnz, rotary_dim // 2] (any float dtype)."""
    out = x.detach().to(torch.float64).clone()
    c = cos.to(out.device, torch.float64)[:, None, :]
    s = sin.to(out.device, torch.float64)[:, None, :]
    if interleave:
        a, b = out[..., 0:rotary_dim:2].clone(), out[..., 1:rotary_dim:2].clone()
        out[..., 0:rotary_dim:2] = a * c - b * s
        out[..., 1:rotary_dim:2] = b * c + a * s
    else:
        half = rotary_dim // 2
        a, b = out[..., :half].clone(), out[..., half:rotary_dim].clone()
        out[..., :half] = a * c - b * s
        out[..., half:rotary_dim] = b * c + a * s
    return out


def rope(x: torch.Tensor, pos: torch.Tensor, rotary_dim: Optional[int] = None, interleave: bool = False,
         rope_scale: float = 1.0, rope_theta: float = 1e4, llama31: bool = False, low_freq_factor: float = 1.0,
         high_freq_factor: float = 4.0, old_context_len: float = 8192.0) -> torch.Tensor:
    """The full definition: float64 RoPE of x [nnz, heads, head_dim] at positions pos [nnz]."""
    rd = x.shape[-1] if rotary_dim is None else rotary_dim
    f = inv_freq(rd, rope_scale, rope_theta, llama31, low_freq_factor, high_freq_factor, old_context_len,
                 device=x.device)
    c, s = cos_sin(pos, f)
    return rotate(x, c, s, rd, interleave)


def rope_meta_complex(x: torch.Tensor, pos: torch.Tensor, freq: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Meta's formulation (interleaved pairs): x[..., 2d] + i x[..., 2d+1] times exp(i angle_d);
    freq float32 [rotary_dim // 2], the angle float32 as above. float64."""
    xf = x.detach().to(torch.float64)
    angle = (pos.to(freq.device, torch.float32)[:, None] * freq[None, :]).to(torch.float64)
    rot = torch.polar(torch.ones_like(angle), angle)[:, None, :]  # [nnz, 1, rd/2] complex128
    xc = torch.view_as_complex(xf[..., :rotary_dim].reshape(*xf.shape[:-1], rotary_dim // 2, 2).contiguous())
    out = xf.clone()
    out[..., :rotary_dim] = torch.view_as_real(xc * rot).reshape(*xf.shape[:-1], rotary_dim)
    return out


def build_cos_sin_cache(max_position: int, rotary_dim: int, base: float = 1e4, device=None) -> torch.Tensor:
    """float32 [max_position, rotary_dim] as vLLM builds it: cat(cos, sin) of t * inv_freq."""
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))
    t = torch.arange(max_position, dtype=torch.float32, device=device)
    freqs = torch.einsum("i,j->ij", t, inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(torch.float32)


def _vllm_apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    if is_neox:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def rope_cos_sin_cache_vllm(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
                            cos_sin_cache: torch.Tensor, is_neox: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM RotaryEmbedding.forward_native in float64; outputs keep the inputs' shapes."""
    pos = positions.flatten().to(torch.int64)
    nnz = pos.shape[0]
    cache = cos_sin_cache.to(torch.float64)
    rd = cache.shape[-1]
    cos, sin = cache.index_select(0, pos.to(cache.device)).chunk(2, dim=-1)
    outs = []
    for t in (query, key):
        shape = t.shape
        x = t.detach().to(torch.float64).reshape(nnz, -1, head_size)
        rot = _vllm_apply_rotary_emb(x[..., :rd], cos, sin, is_neox)
        outs.append(torch.cat((rot, x[..., rd:]), dim=-1).reshape(shape))
    return outs[0], outs[1]
