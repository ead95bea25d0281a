#!/usr/bin/env python3
"""jobscripts/bench_peer.py: the PyTorch peer of zero3d, for speed comparisons.

A GPT written the way zero3d defines it (pre-norm blocks, packed qkv; GPT-2's LayerNorm, learned
positions, tanh GELU and tied LM head, or the Llama family's RMSNorm, RoPE, SwiGLU, grouped-query
attention and untied head, as the config's model keys say), trained from the same zero3d JSON config with AdamW and its lr schedule, on R CPU ranks:
  --mode ddp     DistributedDataParallel over gloo: every rank holds all optimizer state
  --mode zero1   DDP + ZeroRedundancyOptimizer: each rank keeps 1/R of the AdamW state (ZeRO-1)
It measures speed, not correctness: the data order differs from zero3d's.

  python3 jobscripts/bench_peer.py CONFIG [--ranks R] [--mode zero1|ddp] [--steps N] [--warmup N]

With --ranks R > 1 this file is also the launcher: it starts R copies of itself with the
torch.distributed env (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and waits; a failing rank
stops the others and its exit code is returned. Rank 0 prints one JSON line at the end:
  {"framework", "mode", "ranks", "tokens_per_s", "step_s", "loss", ...}
tokens_per_s = median over the timed steps of (micro x gas x ranks x seq_len) / step time.
Per-step progress goes to stderr.
"""
import argparse
import json
import math
import os
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


# ---- the model ---------------------------------------------------------------------------------
def arch_of(m):
    """The architecture keys of a zero3d model config, resolved as zero3d resolves them (input/README.md,
    "The model"): model.arch picks the defaults of the rest."""
    llama = m.get("arch", "gpt2") == "llama"
    C = m["d_model"]
    mlp = m.get("mlp", "swiglu" if llama else "gelu")
    return dict(norm=m.get("norm", "rmsnorm" if llama else "layernorm"), eps=m.get("rms_norm_eps", 1e-5),
                position=m.get("position", "rope" if llama else "learned"), theta=m.get("rope_theta", 500000.0),
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


def rope_table(T, hd, theta):
    """(cos, sin), T x hd/2, the angles in double rounded to float as zero3d's kernels/math/rope.h."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / hd)
    return angle.cos().float(), angle.sin().float()


def rotate(x, cos, sin):
    """RoPE on (B, heads, T, hd): pairs (i, i + hd/2), Hugging Face's rotate-half layout."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


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
        # causal mask: position t sees positions <= t. A plain attribute, not a buffer: DDP would
        # broadcast a buffer, and gloo cannot broadcast bool tensors.
        self.causal = torch.ones(T, T, dtype=torch.bool).tril()
        self.rope = rope_table(T, hd, a["theta"]) if a["position"] == "rope" else None

    def attn(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        # (B, T, C + 2 kv hd) -> (B, heads, T, hd) each
        q, k, v = (t.reshape(B, T, -1, hd).transpose(1, 2) for t in self.qkv(x).split(self.sizes, dim=2))
        if self.rope is not None:
            cos, sin = (t[:T] for t in self.rope)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = self.n_head // k.shape[1]   # grouped-query attention: each key/value head serves `group`
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)   # heads back side by side
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

    def logits(self, idx):
        B, T = idx.shape
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T))
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


# ---- one rank ------------------------------------------------------------------------------------
def train(args, cfg):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(args.threads)
    torch.manual_seed(cfg.get("seed", 1234))   # the same init on every rank (DDP broadcasts it anyway)

    m = cfg["model"]
    B, gas, T = cfg["train_micro_batch_size_per_gpu"], cfg.get("gradient_accumulation_steps", 1), m["seq_len"]
    model = GPT(m["vocab_size"], T, m["n_layer"], m["n_head"], m["d_model"], arch_of(m))
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model

    # AdamW; weight decay on 2-D weights (Linear weights, wte, wpe), not on biases or LayerNorm
    o = cfg["optimizer"]["params"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.get("weight_decay", 0.0)},
              {"params": no_decay, "weight_decay": 0.0}]
    hyper = dict(lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))), eps=o.get("eps", 1e-8))
    if args.mode == "zero1" and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **hyper)
    else:
        opt = torch.optim.AdamW(groups, **hyper)
    clip = cfg.get("gradient_clipping", 0.0)

    tokens = load_tokens(cfg["data"]["train"])
    global_tokens = B * gas * world * T
    barrier = dist.barrier if world > 1 else (lambda: None)
    step_s, losses = [], []
    for step in range(args.warmup + args.steps):
        for g in opt.param_groups:  # the config's schedule, as zero3d follows it
            g["lr"] = lr_at_step(cfg, step + 1)
        barrier()                  # every rank starts the step together
        t0 = time.perf_counter()
        loss_sum = 0.0
        for k in range(gas):
            x, y = micro_batch(tokens, step * gas + k, rank, world, B, T)
            last = k == gas - 1
            # DDP all-reduces gradients on the last micro-batch only
            ctx = net.no_sync() if world > 1 and not last else torch.enable_grad()
            with ctx:
                loss = net(x, y) / gas
                loss.backward()
            loss_sum += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()                 # zero1: each rank updates its shard, then broadcasts it
        opt.zero_grad(set_to_none=True)
        barrier()                  # the step ends when the slowest rank ends
        dt = time.perf_counter() - t0
        # mean loss over the global batch (outside the timed region)
        lt = torch.tensor([loss_sum])
        if world > 1:
            dist.all_reduce(lt)
            lt /= world
        losses.append(lt.item())
        timed = step >= args.warmup
        if timed:
            step_s.append(dt)
        if rank == 0:
            print(f"step {step + 1}{'' if timed else ' (warmup)'}: loss {losses[-1]:.4f}, {dt:.3f} s, "
                  f"{global_tokens / dt:.0f} tokens/s", file=sys.stderr, flush=True)

    if rank == 0:
        print(json.dumps({"framework": "pytorch", "mode": args.mode if world > 1 else "single", "ranks": world,
                          "threads": args.threads, "torch": torch.__version__,
                          "num_params": sum(p.numel() for p in model.parameters()),
                          "tokens_per_s": statistics.median(global_tokens / s for s in step_s),
                          "step_s": step_s, "loss": losses[-1], "losses": losses}), flush=True)
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
    ap.add_argument("--ranks", type=int, default=1, help="processes to launch (default 1)")
    ap.add_argument("--mode", choices=["zero1", "ddp"], default="zero1")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.ranks < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --ranks >= 1")
    if args.ranks > 1 and "RANK" not in os.environ:
        sys.exit(launch(sys.argv[1:], args.ranks))
    with open(args.config) as f:
        train(args, json.load(f))


if __name__ == "__main__":
    main()
