// Causal self-attention of one (batch, head), row by row, on packed rows [q | k | v] of stride ld
// (the head's q_i, and k_j, v_j of the key/value head it reads, each hd wide), scores
// s_ij = alpha q_i . k_j for keys j <= i, alpha = 1/sqrt(hd). With grouped-query attention
// (Hkv key/value heads for H query heads) query head h reads key/value head h / (H / Hkv).
// Forward keeps the row's log-sum-exp for backward:
//   out_i = sum_j p_ij v_j,  p_ij = exp(s_ij - lse_i);
//   D_i = dout_i . out_i,  ds_ij = p_ij (dout_i . v_j - D_i);
//   dq_i = alpha sum_{j<=i} ds_ij k_j;  dk_j = alpha sum_{i>=j} ds_ij q_i;  dv_j = sum_{i>=j} p_ij dout_i.
// These per-row functions are the reference and the CUDA fallback for heads wider than 256 (one
// thread per row); the CUDA backend runs the same math one warp per row, and the host in 64 x 64
// tiles (kernels/host/cpu_kernels_isa.cpp).
#pragma once
#include <cmath>
#include "kernels/math/common.h"

namespace zero3d::math {

Z3D_HD float attention_dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Online softmax over the keys (one pass); out_i (hd wide) is written, the row's lse returned.
// q, k, v: row 0 of the head's query, key and value columns (rows ld apart).
Z3D_HD float attention_row_forward(float* out, const float* q, const float* k, const float* v, long ld, int i, int hd,
                                   float alpha) {
  const float* qi = q + i * ld;
  float m = -INFINITY, l = 0.0f;
  for (int d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int j = 0; j <= i; ++j) {
    const float s = alpha * attention_dot(qi, k + j * ld, hd);
    const float mn = s > m ? s : m;
    const float corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
    for (int d = 0; d < hd; ++d) out[d] = out[d] * corr + p * v[j * ld + d];
    m = mn;
  }
  for (int d = 0; d < hd; ++d) out[d] /= l;
  return m + logf(l);
}

// dq_i (written), from dout rows of stride ldo and out rows of stride ldo.
Z3D_HD void attention_row_backward_q(float* dq, const float* q, const float* k, const float* v, long ld,
                                     const float* dout, const float* out, long ldo, const float* lse, int i, int hd,
                                     float alpha) {
  const float* qi = q + i * ld;
  const float Di = attention_dot(dout + i * ldo, out + i * ldo, hd);
  for (int d = 0; d < hd; ++d) dq[d] = 0.0f;
  for (int j = 0; j <= i; ++j) {
    const float* kj = k + j * ld;
    const float p = expf(alpha * attention_dot(qi, kj, hd) - lse[i]);
    const float ds = p * (attention_dot(dout + i * ldo, v + j * ld, hd) - Di);
    for (int d = 0; d < hd; ++d) dq[d] += alpha * ds * kj[d];
  }
}

// dk_j and dv_j accumulated (+=) over the T queries i >= j of one query head: with grouped-query
// attention a key/value head sums this over the query heads that share it.
Z3D_HD void attention_row_backward_kv(float* dk, float* dv, const float* q, const float* k, const float* v, long ld,
                                      const float* dout, const float* out, long ldo, const float* lse, int j, int T,
                                      int hd, float alpha) {
  const float* kj = k + j * ld;
  for (int i = j; i < T; ++i) {
    const float* qi = q + i * ld;
    const float* g = dout + i * ldo;
    const float p = expf(alpha * attention_dot(qi, kj, hd) - lse[i]);
    const float ds = p * (attention_dot(g, v + j * ld, hd) - attention_dot(g, out + i * ldo, hd));
    for (int d = 0; d < hd; ++d) {
      dv[d] += p * g[d];
      dk[d] += alpha * ds * qi[d];
    }
  }
}

}  // namespace zero3d::math
