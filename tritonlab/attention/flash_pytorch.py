"""FlashAttention-2 in plain PyTorch: the tiled forward of Algorithm 1 and a backward from the saved L.

For q (B, Nq, D) over k, v (B, Nk, D): per query tile, a running max m, sum l and accumulator over
key tiles (o = acc / l, L = m + log l), then a backward that recomputes P = exp(S - L) tile by tile
with Δ = rowsum(dO ∘ O). Nothing here is fast; it is the algorithm written so that each line can
be checked against the paper, and it runs on any device. The Triton version (``flash2.py``) does
the same arithmetic with one program per query tile.
"""

import math

import torch

from ._common import check_qkv

PYTORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Low-precision inputs are accumulated in fp32, like the on-chip accumulators of the kernel.
    return torch.float64 if dtype == torch.float64 else torch.float32


class FlashAttentionPyTorch(torch.autograd.Function):
    """``FlashAttentionPyTorch.apply(q, k, v, is_causal=False)`` with q (B, Nq, D), k and v (B, Nk, D).

    The forward saves L (B, Nq), the natural-log logsumexp of the scaled scores, next to Q, K, V
    and O; the backward recomputes the probabilities P from L instead of storing them.
    """

    Q_TILE = 32  # B_r in the paper: queries per tile
    K_TILE = 32  # B_c: keys per tile

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        check_qkv(q, k, v, ndim=3, dtypes=PYTORCH_DTYPES, head_dims=None, kernel_device=False)
        batch, n_q, head_dim = q.shape
        n_k = k.shape[1]
        scale = 1.0 / math.sqrt(head_dim)
        acc_dtype = _compute_dtype(q.dtype)
        o = torch.empty_like(q)
        lse = torch.empty(batch, n_q, dtype=acc_dtype, device=q.device)
        for q0 in range(0, n_q, FlashAttentionPyTorch.Q_TILE):
            q1 = min(q0 + FlashAttentionPyTorch.Q_TILE, n_q)
            q_tile = q[:, q0:q1].to(acc_dtype)
            row_max = torch.full((batch, q1 - q0), float("-inf"), dtype=acc_dtype, device=q.device)
            row_sum = torch.zeros(batch, q1 - q0, dtype=acc_dtype, device=q.device)
            acc = torch.zeros(batch, q1 - q0, head_dim, dtype=acc_dtype, device=q.device)
            # Causal: key tiles that start after this tile's last query hold only masked scores.
            k_end = min(n_k, q1) if is_causal else n_k
            for k0 in range(0, k_end, FlashAttentionPyTorch.K_TILE):
                k1 = min(k0 + FlashAttentionPyTorch.K_TILE, n_k)
                scores = q_tile @ k[:, k0:k1].to(acc_dtype).transpose(1, 2) * scale
                if is_causal and k1 - 1 > q0:  # the tile crosses the diagonal
                    rows = torch.arange(q0, q1, device=q.device)[:, None]
                    cols = torch.arange(k0, k1, device=q.device)[None, :]
                    scores = scores.masked_fill(rows < cols, float("-inf"))
                new_max = torch.maximum(row_max, scores.amax(dim=-1))
                p = torch.exp(scores - new_max[..., None])
                rescale = torch.exp(row_max - new_max)  # earlier tiles were scaled by an older max
                row_sum = rescale * row_sum + p.sum(dim=-1)
                acc = rescale[..., None] * acc + p @ v[:, k0:k1].to(acc_dtype)
                row_max = new_max
            o[:, q0:q1] = (acc / row_sum[..., None]).to(q.dtype)
            lse[:, q0:q1] = row_max + torch.log(row_sum)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        n_k, head_dim = k.shape[1], k.shape[2]
        scale = 1.0 / math.sqrt(head_dim)
        acc_dtype = lse.dtype
        q_, grad_o_ = q.to(acc_dtype), grad_o.to(acc_dtype)
        # D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij, the term the softmax Jacobian subtracts.
        delta = (grad_o_ * o.to(acc_dtype)).sum(dim=-1)
        dq = torch.zeros_like(q_)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        # Key tiles outer, as in Algorithm 2: dK_j and dV_j are finished in one pass over the queries.
        for k0 in range(0, n_k, FlashAttentionPyTorch.K_TILE):
            k1 = min(k0 + FlashAttentionPyTorch.K_TILE, n_k)
            k_tile, v_tile = k[:, k0:k1].to(acc_dtype), v[:, k0:k1].to(acc_dtype)
            q0 = k0 if ctx.is_causal else 0  # causal: queries before k0 see none of these keys
            if q0 >= q.shape[1]:  # ...and with Nk > Nq, the last keys are seen by no query at all
                dk[:, k0:k1], dv[:, k0:k1] = 0, 0
                continue
            scores = q_[:, q0:] @ k_tile.transpose(1, 2) * scale
            p = torch.exp(scores - lse[:, q0:, None])
            if ctx.is_causal:
                rows = torch.arange(q0, q.shape[1], device=q.device)[:, None]
                cols = torch.arange(k0, k1, device=q.device)[None, :]
                p = p.masked_fill(rows < cols, 0.0)
            dv[:, k0:k1] = (p.transpose(1, 2) @ grad_o_[:, q0:]).to(v.dtype)
            dp = grad_o_[:, q0:] @ v_tile.transpose(1, 2)
            ds = p * (dp - delta[:, q0:, None])
            dq[:, q0:] += ds @ k_tile * scale
            dk[:, k0:k1] = (ds.transpose(1, 2) @ q_[:, q0:] * scale).to(k.dtype)
        return dq.to(q.dtype), dk, dv, None


__all__ = ["FlashAttentionPyTorch"]
