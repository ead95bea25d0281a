#!/usr/bin/env python3
"""jobscripts/bench_peer.py: the PyTorch peer of zero3d, for speed comparisons.

A GPT written the way zero3d defines it (pre-norm blocks, packed qkv; GPT-2's LayerNorm, learned
positions, tanh GELU and tied LM head, or the Llama family's RMSNorm, RoPE, SwiGLU, grouped-query
attention and untied head, as the config's model keys say), trained from the same zero3d JSON
config with AdamW and its lr schedule. Two settings:
  on R CPU ranks (--device cpu, the default):
    --mode ddp     DistributedDataParallel over gloo: every rank holds all optimizer state
    --mode zero1   DDP + ZeroRedundancyOptimizer: each rank keeps 1/R of the AdamW state (ZeRO-1)
  on one GPU (--device cuda, one process): PyTorch at its best on the card zero3d ran on,
    attention through scaled_dot_product_attention pinned to the first of --sdpa-backends that
    runs at the model's shape, fused AdamW, and with --compile the model under torch.compile.
It measures speed, not correctness: the data order differs from zero3d's.

  python3 jobscripts/bench_peer.py CONFIG [--set KEY=VALUE ...] [--device cpu|cuda] [--bf16] [--compile]
      [--ranks R] [--mode zero1|ddp] [--steps N] [--warmup N] [--threads N] [--peak-flops F]
      [--sdpa-backends cudnn,flash,efficient,math]

--set takes zero3d's overrides, applied in order (VALUE as JSON, else a plain string), so one
argument list trains both; keys the peer does not read (zero_optimization.*, data.val, ...) are
ignored. bf16.enabled (or --bf16) runs the model under bf16 autocast, the weights, gradients and
AdamW state in fp32 as in zero3d's bf16 mode. An empty data.train trains on random tokens.
What the torch at hand lacks is said, never pretended: without scaled_dot_product_attention
(torch < 2.0) attention is the manual softmax(q k^T) v ("attention": "manual ..."); without
fused AdamW the plain one runs; --compile without torch.compile prints {"error": ...} and exits 3.

With --ranks R > 1 this file is also the launcher: it starts R copies of itself with the
torch.distributed env (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and waits; a failing rank
stops the others and its exit code is returned. Rank 0 prints one JSON line at the end:
  {"framework", "mode", "ranks", "device", "dtype", "attention", "optimizer", "compiled",
   "num_params", "flops_per_token", "tokens_per_s", "mfu", "peak_memory_bytes", "step_s", "loss", ...}
tokens_per_s = median over the timed steps of (micro x gas x ranks x seq_len) / step time; the
warm-up steps (torch.compile compiles in the first) are untimed, and on CUDA the clock is read
after torch.cuda.synchronize(). flops_per_token is zero3d's count (model/gpt.cpp,
gpt_flops_per_token); mfu = tokens_per_s x flops_per_token / (ranks x --peak-flops), null
without it. peak_memory_bytes: torch.cuda.max_memory_allocated on CUDA; on the CPU the process's
max RSS (rank 0's), as "peak_memory" says. Per-step progress goes to stderr.
"""
import argparse
import contextlib
import inspect
import json
import math
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

TORCH = tuple(int(v) for v in re.findall(r"\d+", torch.__version__)[:2])
SDPA = getattr(F, "scaled_dot_product_attention", None)   # torch >= 2.0
SDPA_GQA = SDPA is not None and TORCH >= (2, 5)            # its enable_gqa: shared k, v heads, no copies


# ---- the model ---------------------------------------------------------------------------------
def arch_of(m):
    """The architecture keys of a zero3d model config, resolved as zero3d resolves them (input/README.md,
    "The model"): model.arch picks the defaults of the rest."""
    llama = m.get("arch", "gpt2") == "llama"
    C = m["d_model"]
    mlp = m.get("mlp", "swiglu" if llama else "gelu")
    return dict(norm=m.get("norm", "rmsnorm" if llama else "layernorm"), eps=m.get("rms_norm_eps", 1e-5),
                position=m.get("position", "rope" if llama else "learned"), theta=m.get("rope_theta", 500000.0),
                rope_scaling=m.get("rope_scaling", {}),
                mlp=mlp, ffn=m.get("intermediate_size") or ((8 * C // 3 + 255) // 256 * 256 if mlp == "swiglu" else 4 * C),
                kv=m.get("num_key_value_heads", m["n_head"]), bias=m.get("bias", not llama),
                tie=m.get("tie_word_embeddings", not llama))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def norm(a, C):
    return RMSNorm(C, a["eps"]) if a["norm"] == "rmsnorm" else nn.LayerNorm(C, eps=1e-5)


def llama3_inv_freq(inv_freq, s):
    """Llama 3.1's RoPE scaling as transformers writes it (modeling_rope_utils.py,
    _compute_llama3_parameters), on a tensor of inverse frequencies; s: the rope_scaling keys."""
    factor, low, high = s.get("factor", 8.0), s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_context = s.get("original_max_position_embeddings", 8192)
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_table(T, hd, theta, scaling=None):
    """(cos, sin), T x hd/2, the angles in double rounded to float as zero3d's kernels/math/rope.h;
    scaling: the model's rope_scaling keys (rope_type "default" or "llama3")."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / hd)
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    elif kind != "default":
        sys.exit(f"bench_peer.py: rope_scaling type {kind!r} is not implemented here")
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
    return angle.cos().float(), angle.sin().float()


def rotate(x, cos, sin):
    """RoPE on (B, heads, T, hd): pairs (i, i + hd/2), Hugging Face's rotate-half layout; computed in
    fp32 (the tables' type), returned in x's type (bf16 under autocast)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


def attend(q, k, v):
    """Causal attention on (B, heads, T, hd); k and v may have fewer heads, each serving a group of
    query heads (grouped-query attention). scaled_dot_product_attention where torch has it (which
    of its backends runs is pinned by the caller, see sdpa_backend), else written out."""
    group = q.shape[1] // k.shape[1]
    if SDPA is not None and group > 1 and SDPA_GQA:
        return SDPA(q, k, v, is_causal=True, enable_gqa=True)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if SDPA is not None:
        return SDPA(q, k, v, is_causal=True)
    T = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()   # position t sees positions <= t
    return att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v


class Block(nn.Module):
    """x = x + proj(attn(norm_1(x))); x = x + fc_proj(act(fc(norm_2(x)))), act = tanh GELU or SwiGLU"""

    def __init__(self, C, n_head, T, a):
        super().__init__()
        self.n_head, self.a = n_head, a
        hd = C // n_head
        self.sizes = [C, a["kv"] * hd, a["kv"] * hd]
        self.ln_1 = norm(a, C)
        self.qkv = nn.Linear(C, sum(self.sizes), bias=a["bias"])   # q, k, v packed in one GEMM
        self.proj = nn.Linear(C, C, bias=a["bias"])                 # residual projection 1
        self.ln_2 = norm(a, C)
        self.fc = nn.Linear(C, a["ffn"] * (2 if a["mlp"] == "swiglu" else 1), bias=a["bias"])  # [gate | up]
        self.fc_proj = nn.Linear(a["ffn"], C, bias=a["bias"])      # residual projection 2
        # A plain attribute, not a buffer (DDP would broadcast it every step); GPT.to_device moves it.
        self.rope = rope_table(T, hd, a["theta"], a.get("rope_scaling")) if a["position"] == "rope" else None

    def attn(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        # (B, T, C + 2 kv hd) -> (B, heads, T, hd) each
        q, k, v = (t.reshape(B, T, -1, hd).transpose(1, 2) for t in self.qkv(x).split(self.sizes, dim=2))
        if self.rope is not None:
            cos, sin = (t[:T] for t in self.rope)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = attend(q, k, v).transpose(1, 2).reshape(B, T, C)   # heads back side by side
        return self.proj(y)

    def mlp(self, x):
        h = self.fc(x)
        if self.a["mlp"] == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            return self.fc_proj(F.silu(gate) * up)
        return self.fc_proj(F.gelu(h, approximate="tanh"))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len, n_layer, n_head, d_model, arch=None):
        super().__init__()
        a = self.a = arch or arch_of(dict(d_model=d_model, n_head=n_head))
        self.seq_len = seq_len
        self.wte = nn.Embedding(vocab_size, d_model)   # also the LM head when tied
        self.wpe = nn.Embedding(seq_len, d_model) if a["position"] == "learned" else None
        self.blocks = nn.ModuleList(Block(d_model, n_head, seq_len, a) for _ in range(n_layer))
        self.ln_f = norm(a, d_model)
        self.lm_head = None if a["tie"] else nn.Linear(d_model, vocab_size, bias=False)
        # GPT-2 init: N(0, 0.02), the residual projections scaled by 1/sqrt(2 n_layer) so the
        # residual stream's variance does not grow with depth; biases 0; norms 1 and 0.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                residual = name.endswith("proj.weight")   # proj and fc_proj
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer) if residual else 0.02)

    def to_device(self, device):
        """The parameters and the blocks' RoPE tables (plain attributes) on `device`."""
        self.to(device)
        for b in self.blocks:
            if b.rope is not None:
                b.rope = tuple(t.to(device) for t in b.rope)
        return self

    def flops_per_token(self):
        """zero3d's model FLOPs per trained token (model/gpt.cpp, gpt_flops_per_token): 6 per parameter
        that takes part in a matrix multiply (all but the position embedding; the token embedding
        only as the tied LM head, a lookup otherwise), plus causal attention's
        6 n_layer d_model (seq_len + 1)."""
        n = sum(p.numel() for p in self.parameters())
        if self.wpe is not None:
            n -= self.wpe.weight.numel()
        if self.lm_head is not None:
            n -= self.wte.weight.numel()
        return 6.0 * n + 6.0 * len(self.blocks) * self.wte.weight.shape[1] * (self.seq_len + 1)

    def logits(self, idx):
        B, T = idx.shape
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.ln_f(x), head)   # ln_f(x) @ W^T, no bias

    def forward(self, idx, targets):
        B, T = idx.shape
        return F.cross_entropy(self.logits(idx).view(B * T, -1), targets.reshape(B * T))   # mean over B*T

    def zero3d_names(self):
        """This model's parameters under zero3d's tensor names (model/gpt.cpp's table)."""
        names = {"wte": self.wte.weight, "ln_f.weight": self.ln_f.weight}
        if self.wpe is not None:
            names["wpe"] = self.wpe.weight
        if getattr(self.ln_f, "bias", None) is not None:
            names["ln_f.bias"] = self.ln_f.bias
        if self.lm_head is not None:
            names["lm_head.weight"] = self.lm_head.weight
        ours = {"ln_1": "ln_1", "qkv": "attn.c_attn", "proj": "attn.c_proj", "ln_2": "ln_2", "fc": "mlp.c_fc",
                "fc_proj": "mlp.c_proj"}
        for l, b in enumerate(self.blocks):
            for name, p in b.named_parameters():
                mod, kind = name.split(".")
                names[f"h.{l}.{ours[mod]}.{kind}"] = p
        return names


# ---- data: an llm.c token file ---------------------------------------------------------------------
def load_tokens(path):
    """256 int32 header words (magic 20240520, version 1, token count), then uint16 tokens."""
    if not os.path.isfile(path):
        sys.exit(f"bench_peer: data.train {path}: no such file (a relative path is taken from the working "
                 "directory, as zero3d takes it; empty: random tokens)")
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header.size < 3 or header[0] != 20240520 or header[1] != 1:
        sys.exit(f"bench_peer: {path}: not an llm.c token file (magic 20240520, version 1)")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=256 * 4, shape=(int(header[2]),))


def micro_batch(tokens, g, rank, world, B, T):
    """Micro-batch number g of this rank: B windows of T+1 tokens (stride T), round-robin over ranks."""
    n_seq = (len(tokens) - 1) // T
    starts = [((g * world + rank) * B + b) % n_seq * T for b in range(B)]
    rows = np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64)
    x = torch.from_numpy(rows)
    return x[:, :-1], x[:, 1:]   # inputs, targets shifted by one


def lr_at_step(cfg, step):
    """The learning rate of optimizer step `step` (1-based) under the config's DeepSpeed scheduler,
    as zero3d's optim/lr_schedule.cpp computes it (lr_for_step: the schedule's iteration is step - 2,
    DeepSpeed's count). Without a scheduler, the optimizer's lr."""
    base = cfg["optimizer"]["params"]["lr"]
    sc = cfg.get("scheduler") or {}
    kind, p = sc.get("type", ""), sc.get("params", {})
    if not kind:
        return base
    it = step - 2
    W = max(2, p.get("warmup_num_steps", 1000))
    T = p.get("total_num_steps", cfg.get("train_steps"))
    linear = p.get("warmup_type", "log") == "linear"
    frac = (lambda i: i / W) if linear else (lambda i: math.log(i + 1) / math.log(W))
    if kind in ("WarmupLR", "WarmupDecayLR"):
        lo, hi = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", base)
        if it < 0:
            return lo
        gamma = frac(it) if it < W else (max(0.0, (T - it) / max(1.0, T - W)) if kind == "WarmupDecayLR" else 1.0)
        return lo + (hi - lo) * gamma
    if kind != "WarmupCosineLR":
        raise SystemExit(f"bench_peer.py: scheduler {kind} is not one zero3d implements")
    if it < 0:
        return 0.0
    if it < W:
        r0 = p.get("warmup_min_ratio", 0.0)
        return base * (r0 + frac(it) * (1.0 - r0))
    progress = min(1.0, (it - W + 1) / max(1, T - W))
    floor = p.get("cos_min_ratio", 0.0001)
    return base * max(0.0, floor + (1.0 - floor) * (1.0 + math.cos(math.pi * progress)) / 2.0)


# ---- the config: zero3d's file and --set overrides ------------------------------------------------
def apply_sets(cfg, overrides):
    """zero3d's --set KEY=VALUE on the config, in order: VALUE parsed as JSON, else taken as a plain
    string (config/json_tree.cpp, parse_value), the dotted KEY's objects made where missing."""
    for o in overrides:
        key, eq, text = o.partition("=")
        if not eq or not key:
            sys.exit(f"bench_peer.py: malformed --set '{o}': expected KEY=VALUE, e.g. --set model.n_layer=2")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        *parents, last = key.split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                sys.exit(f"bench_peer.py: --set {o}: '{p}' is not an object in the config")
        node[last] = value
    return cfg


def bf16_of(cfg):
    """bf16.enabled (or DeepSpeed's old name bfloat16.enabled); fp16 is a mode the peer does not have."""
    if (cfg.get("fp16") or {}).get("enabled"):
        sys.exit("bench_peer.py: fp16.enabled: the peer trains in fp32 or bf16 only")
    return bool((cfg.get("bf16") or cfg.get("bfloat16") or {}).get("enabled"))


# ---- what runs: attention, optimizer -------------------------------------------------------------
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}


def sdpa_backend(wanted, device, dtype, B, n_head, n_kv, T, hd):
    """(what attention runs, a context that keeps it so). scaled_dot_product_attention is pinned to
    the first backend of `wanted` whose forward and backward run at the model's shape (tried here on
    random q, k, v), so the name says what ran; refused ones are listed with torch's reason."""
    if SDPA is None:
        return f"manual (torch {torch.__version__} has no scaled_dot_product_attention)", contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel   # torch >= 2.3
    except ImportError:
        return "sdpa (torch's pick: this torch cannot pin a backend)", contextlib.nullcontext()
    refused = []
    for name in wanted:
        backend = getattr(SDPBackend, SDPA_BACKENDS[name], None)
        if backend is None:
            refused.append(f"{name}: not in torch {torch.__version__}")
            continue
        q = torch.randn(B, n_head, T, hd, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(B, n_kv, T, hd, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
        try:
            with sdpa_kernel([backend]):
                attend(q, k, v).sum().backward()
        except RuntimeError as e:
            refused.append(f"{name}: {str(e).strip().splitlines()[0][:120]}")
            continue
        return f"sdpa/{name}" + (f" (refused: {'; '.join(refused)})" if refused else ""), sdpa_kernel([backend])
    sys.exit(f"bench_peer.py: no attention backend of --sdpa-backends runs at this shape: {'; '.join(refused)}")


def adamw(groups, hyper, device):
    """(optimizer, its name): torch.optim.AdamW, fused (one kernel for all tensors) on CUDA where torch has it."""
    if device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        return torch.optim.AdamW(groups, fused=True, **hyper), "AdamW, fused"
    return torch.optim.AdamW(groups, **hyper), "AdamW"


# ---- one rank ------------------------------------------------------------------------------------
def train(args, cfg):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(args.device)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if args.threads or dev.type == "cpu":   # one thread a CPU rank unless told; on CUDA torch's own count
        torch.set_num_threads(args.threads or 1)
    torch.manual_seed(cfg.get("seed", 1234))   # the same init on every rank (DDP broadcasts it anyway)

    m = cfg["model"]
    B, gas, T = cfg["train_micro_batch_size_per_gpu"], cfg.get("gradient_accumulation_steps", 1), m["seq_len"]
    bf16 = args.bf16 or bf16_of(cfg)
    model = GPT(m["vocab_size"], T, m["n_layer"], m["n_head"], m["d_model"], arch_of(m)).to_device(dev)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    if args.compile:
        net = torch.compile(net)   # compiles at the first step, a warm-up step
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16)
    hd = m["d_model"] // m["n_head"]
    attention, pinned = sdpa_backend(args.sdpa_backends, dev, torch.bfloat16 if bf16 else torch.float32,
                                     B, m["n_head"], model.a["kv"], T, hd)

    # AdamW; weight decay on 2-D weights (Linear weights, wte, wpe), not on biases or LayerNorm
    o = cfg["optimizer"]["params"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.get("weight_decay", 0.0)},
              {"params": no_decay, "weight_decay": 0.0}]
    hyper = dict(lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))), eps=o.get("eps", 1e-8))
    if args.mode == "zero1" and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt, opt_name = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **hyper), "AdamW, ZeRO-1"
    else:
        opt, opt_name = adamw(groups, hyper, dev)
    clip = cfg.get("gradient_clipping", 0.0)

    data = (cfg.get("data") or {}).get("train") or ""
    tokens = load_tokens(data) if data else None

    def batch(g):   # micro-batch g of this rank, on the device; random tokens without data.train (speed only)
        if tokens is not None:
            return (t.to(dev) for t in micro_batch(tokens, g, rank, world, B, T))
        rows = torch.randint(m["vocab_size"], (B, T + 1), device=dev)
        return rows[:, :-1], rows[:, 1:]
    global_tokens = B * gas * world * T
    barrier = dist.barrier if world > 1 else (lambda: None)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)   # the clock waits for the GPU
    step_s, warmup_s, losses = [], [], []
    with pinned:
        for step in range(args.warmup + args.steps):
            for g in opt.param_groups:  # the config's schedule, as zero3d follows it
                g["lr"] = lr_at_step(cfg, step + 1)
            barrier()                  # every rank starts the step together
            sync()
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), device=dev)   # read after the clock stops: no sync inside the step
            for k in range(gas):
                x, y = batch(step * gas + k)
                last = k == gas - 1
                # DDP all-reduces gradients on the last micro-batch only
                with net.no_sync() if world > 1 and not last else contextlib.nullcontext():
                    with autocast:
                        loss = net(x, y) / gas
                    loss.backward()
                loss_sum += loss.detach()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()                 # zero1: each rank updates its shard, then broadcasts it
            opt.zero_grad(set_to_none=True)
            sync()
            barrier()                  # the step ends when the slowest rank ends
            dt = time.perf_counter() - t0
            # mean loss over the global batch (outside the timed region)
            lt = loss_sum.float().reshape(1).cpu()
            if world > 1:
                dist.all_reduce(lt)
                lt /= world
            losses.append(lt.item())
            timed = step >= args.warmup
            (step_s if timed else warmup_s).append(dt)
            if rank == 0:
                print(f"step {step + 1}{'' if timed else ' (warmup)'}: loss {losses[-1]:.4f}, {dt:.3f} s, "
                      f"{global_tokens / dt:.0f} tokens/s", file=sys.stderr, flush=True)

    if rank == 0:
        tps = statistics.median(global_tokens / s for s in step_s)
        fpt = model.flops_per_token()
        if dev.type == "cuda":
            peak, peak_how = torch.cuda.max_memory_allocated(dev), "torch.cuda.max_memory_allocated"
        else:   # Linux reports kB
            peak, peak_how = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max RSS of rank 0's process"
        print(json.dumps({"framework": "pytorch", "mode": args.mode if world > 1 else "single", "ranks": world,
                          "threads": torch.get_num_threads(), "torch": torch.__version__,
                          "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                          "dtype": "bf16 autocast, fp32 weights" if bf16 else "fp32",
                          "attention": attention, "optimizer": opt_name, "compiled": args.compile,
                          "data": data or "random tokens",
                          "num_params": sum(p.numel() for p in model.parameters()), "flops_per_token": fpt,
                          "tokens_per_s": tps, "peak_flops": args.peak_flops,
                          "mfu": tps * fpt / (world * args.peak_flops) if args.peak_flops else None,
                          "peak_memory_bytes": peak, "peak_memory": peak_how,
                          "step_s": step_s, "warmup_s": warmup_s, "loss": losses[-1], "losses": losses}), flush=True)
    if world > 1:
        dist.destroy_process_group()


# ---- the launcher ------------------------------------------------------------------------------
def launch(argv, ranks):
    """Start `ranks` copies of this script with the torch.distributed env; first failure wins."""
    with socket.socket() as s:     # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(ranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    rc = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:
                rc = failed[0]
                break
            time.sleep(0.2)
        rc = rc or next((p.returncode for p in procs if p.returncode), 0)
    finally:
        for p in procs:            # stop the survivors of a failure (or of Ctrl-C)
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="a zero3d JSON config (model.*, micro-batch, gas, optimizer, data.train)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a zero3d override of the config, as zero3d train takes it (repeatable)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one process on GPU 0")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast even where the config's bf16.enabled is off")
    ap.add_argument("--compile", action="store_true", help="the model under torch.compile (single process)")
    ap.add_argument("--sdpa-backends", default="cudnn,flash,efficient,math",
                    help="scaled_dot_product_attention's backends to try, in order (default %(default)s)")
    ap.add_argument("--peak-flops", type=float, help="one rank's peak FLOP/s, the MFU's denominator (zero3d's "
                    "run record's peak_flops, for the same one)")
    ap.add_argument("--ranks", type=int, default=1, help="CPU processes to launch (default 1)")
    ap.add_argument("--mode", choices=["zero1", "ddp"], default="zero1")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads per rank (default 1 on the CPU; "
                    "torch's own count with --device cuda)")
    args = ap.parse_args()
    args.sdpa_backends = args.sdpa_backends.split(",")
    if args.steps < 1 or args.warmup < 0 or args.ranks < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --ranks >= 1")
    if not set(args.sdpa_backends) <= set(SDPA_BACKENDS):
        ap.error(f"--sdpa-backends: a comma-separated list of {', '.join(SDPA_BACKENDS)}")
    if args.ranks > 1 and (args.device == "cuda" or args.compile):
        ap.error("--device cuda and --compile run one process: leave out --ranks")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench_peer.py: --device cuda: torch {torch.__version__} sees no CUDA device")
    if args.compile and not hasattr(torch, "compile"):
        why = f"torch.compile is not in torch {torch.__version__} (it came with 2.0)"
        print(json.dumps({"framework": "pytorch", "torch": torch.__version__, "compiled": False, "error": why}))
        print(f"bench_peer.py: --compile: {why}", file=sys.stderr)
        sys.exit(3)
    if args.ranks > 1 and "RANK" not in os.environ:
        sys.exit(launch(sys.argv[1:], args.ranks))
    with open(args.config) as f:
        train(args, apply_sets(json.load(f), args.overrides))


if __name__ == "__main__":
    main()
