#!/usr/bin/env python3
"""jobscripts/bench_peer.py: the PyTorch peer of zero3d, for speed comparisons.

A GPT-2 written the way zero3d defines it (pre-LayerNorm blocks, packed qkv, tanh GELU, LM head
tied to wte), trained from the same zero3d JSON config with AdamW and its lr schedule, on R CPU ranks:
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
class Block(nn.Module):
    """x = x + proj(attn(ln_1(x))); x = x + fc_proj(gelu_tanh(fc(ln_2(x))))"""

    def __init__(self, C, n_head, T):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)        # q, k, v packed in one GEMM
        self.proj = nn.Linear(C, C)           # residual projection 1
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)    # residual projection 2
        # causal mask: position t sees positions <= t. A plain attribute, not a buffer: DDP would
        # broadcast a buffer, and gloo cannot broadcast bool tensors.
        self.causal = torch.ones(T, T, dtype=torch.bool).tril()

    def attn(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        # (B, T, 3C) -> three (B, n_head, T, hd)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)   # heads back side by side
        return self.proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len, n_layer, n_head, d_model):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)   # also the LM head (tied)
        self.wpe = nn.Embedding(seq_len, d_model)      # learned positions
        self.blocks = nn.ModuleList(Block(d_model, n_head, seq_len) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        # GPT-2 init: N(0, 0.02), the residual projections scaled by 1/sqrt(2 n_layer) so the
        # residual stream's variance does not grow with depth; biases 0; LayerNorm 1 and 0.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                residual = name.endswith("proj.weight")   # proj and fc_proj
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer) if residual else 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)   # ln_f(x) @ wte^T, no bias
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))   # mean over B*T


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
    model = GPT(m["vocab_size"], T, m["n_layer"], m["n_head"], m["d_model"])
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
