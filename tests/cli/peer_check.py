#!/usr/bin/env python3
"""tests/cli/peer_check.py: zero3d against an independent implementation (jobscripts/bench_peer.py's
PyTorch model), through the Hugging Face export.

  peer_check.py HF_DIR TOKENS METRICS CKPT [CKPT ...]

HF_DIR: `zero3d ckpt export --format hf` of a checkpoint taken after one step at learning rate 0
(the weights are the initial ones) with Adam's beta1 = 0 and no clipping, so that each checkpoint's
/optimizer/exp_avg holds that step's gradient. The PyTorch model is built from HF_DIR/config.json
and loaded from HF_DIR/model.safetensors (read here; transformers' names and layouts mapped back to
zero3d's), then run on the first seq_len + 1 tokens of TOKENS (one sequence):
  - the export: every tensor transformers expects is there, with its shape, and maps back bitwise
    to the checkpoint's /model weights;
  - the loss: within 1e-5 relative of zero3d's step-1 loss in METRICS;
  - the gradients: every tensor of every CKPT (one per layout) within 1e-5 relative (norm-wise)
    of PyTorch's;
  - with PEER_GENERATED (the ids `zero3d generate --temperature 0 --ids` printed) and PEER_PROMPT
    (how many of them are the prompt): the same greedy tokens from the whole prefix here (a
    near-tie within 1e-5 of the largest logit ends the comparison without failing).
"""
import json
import os
import sys

import h5py
import numpy as np
import torch

from z3dcheck import f32_tensors, train

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "jobscripts"))
import bench_peer  # noqa: E402


def transformers_names(cfg):
    """The state-dict keys transformers' GPT2LMHeadModel / LlamaForCausalLM load (modeling_gpt2.py,
    modeling_llama.py), written out here, independently of src/ckpt/hf.cpp."""
    L = range(cfg.get("n_layer", cfg.get("num_hidden_layers")))
    if cfg["model_type"] == "gpt2":  # lm_head.weight is tied to wte and not stored
        names = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"}
        for l in L:
            for m in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                names |= {f"transformer.h.{l}.{m}.weight", f"transformer.h.{l}.{m}.bias"}
        return names
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for l in L:
        p = f"model.layers.{l}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        for proj, bias in [(f"self_attn.{x}_proj", cfg["attention_bias"]) for x in "qkvo"] + \
                          [(f"mlp.{x}_proj", cfg["mlp_bias"]) for x in ("gate", "up", "down")]:
            names |= {p + proj + ".weight"} | ({p + proj + ".bias"} if bias else set())
    return names


def to_zero3d(cfg, hf):
    """HF tensors -> zero3d's names and layouts (the inverse of src/ckpt/hf.cpp)."""
    z = {}
    if cfg["model_type"] == "gpt2":
        for name, t in hf.items():
            assert name.startswith("transformer."), name
            n = name[len("transformer."):]
            n = n[:-len(".weight")] if n in ("wte.weight", "wpe.weight") else n
            z[n] = t.T.copy() if t.ndim == 2 and n.startswith("h.") else t
        return z
    take = dict(hf)
    z["wte"] = take.pop("model.embed_tokens.weight")
    z["ln_f.weight"] = take.pop("model.norm.weight")
    if "lm_head.weight" in take:
        z["lm_head.weight"] = take.pop("lm_head.weight")
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        z[f"h.{l}.ln_1.weight"] = take.pop(p + "input_layernorm.weight")
        z[f"h.{l}.ln_2.weight"] = take.pop(p + "post_attention_layernorm.weight")
        for kind in ["weight"] + (["bias"] if cfg["attention_bias"] else []):
            z[f"h.{l}.attn.c_attn.{kind}"] = np.concatenate([take.pop(p + f"self_attn.{x}_proj.{kind}") for x in "qkv"])
            z[f"h.{l}.attn.c_proj.{kind}"] = take.pop(p + f"self_attn.o_proj.{kind}")
        for kind in ["weight"] + (["bias"] if cfg["mlp_bias"] else []):
            z[f"h.{l}.mlp.c_fc.{kind}"] = np.concatenate([take.pop(p + f"mlp.{x}_proj.{kind}") for x in ("gate", "up")])
            z[f"h.{l}.mlp.c_proj.{kind}"] = take.pop(p + f"mlp.down_proj.{kind}")
    assert not take, f"tensors transformers would not expect: {sorted(take)}"
    return z


def model_config(cfg):
    """config.json -> zero3d's model keys."""
    if cfg["model_type"] == "gpt2":
        return dict(vocab_size=cfg["vocab_size"], seq_len=cfg["n_positions"], n_layer=cfg["n_layer"],
                    n_head=cfg["n_head"], d_model=cfg["n_embd"], arch="gpt2")
    return dict(vocab_size=cfg["vocab_size"], seq_len=cfg["max_position_embeddings"], n_layer=cfg["num_hidden_layers"],
                n_head=cfg["num_attention_heads"], d_model=cfg["hidden_size"], arch="llama",
                num_key_value_heads=cfg["num_key_value_heads"], intermediate_size=cfg["intermediate_size"],
                rope_theta=cfg["rope_theta"], rms_norm_eps=cfg["rms_norm_eps"], bias=cfg["attention_bias"],
                tie_word_embeddings=cfg["tie_word_embeddings"], rope_scaling=cfg.get("rope_scaling") or {})


def main():
    hf_dir, tokens_path, metrics, ckpts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    try:
        hf = f32_tensors(os.path.join(hf_dir, "model.safetensors"))
    except ValueError as e:
        sys.exit(f"peer_check: {e}; the check reads F32 exports")
    if set(hf) != transformers_names(cfg):
        sys.exit(f"peer_check: FAIL the export's names are not transformers': {sorted(set(hf) ^ transformers_names(cfg))}")
    z = to_zero3d(cfg, hf)
    m = model_config(cfg)
    torch.manual_seed(0)
    model = bench_peer.GPT(m["vocab_size"], m["seq_len"], m["n_layer"], m["n_head"], m["d_model"], bench_peer.arch_of(m))
    params = model.zero3d_names()
    assert sorted(params) == sorted(z), f"names differ: {sorted(set(params) ^ set(z))}"
    failed = 0
    with h5py.File(ckpts[0], "r") as f:  # the export maps back to the checkpoint's weights bitwise
        for name, t in z.items():
            if not np.array_equal(f["model/" + name][:len(t)], t):  # rows past the vocabulary: padding
                print(f"FAIL export of {name} differs from the checkpoint's /model/{name}")
                failed += 1
    with torch.no_grad():
        for name, p in params.items():
            assert tuple(p.shape) == z[name].shape, f"{name}: {tuple(p.shape)} vs {z[name].shape}"
            p.copy_(torch.from_numpy(z[name].copy()))
    T = m["seq_len"]
    seq = torch.from_numpy(bench_peer.load_tokens(tokens_path)[:T + 1].astype(np.int64))[None]
    loss = model(seq[:, :-1], seq[:, 1:])
    loss.backward()
    z_loss = next(r["loss"] for r in train(metrics) if r["step"] == 1)
    err = abs(z_loss - loss.item()) / abs(loss.item())
    print(f"loss: zero3d {z_loss:.9g}, PyTorch {loss.item():.9g}, relative difference {err:.2e}")
    if err > 1e-5:
        print("FAIL loss")
        failed += 1
    for ck in ckpts:
        worst, where = 0.0, ""
        with h5py.File(ck, "r") as f:
            for name, p in params.items():
                g, ours = p.grad.double().numpy(), f["optimizer/exp_avg/" + name][...].astype(np.float64)
                if len(ours) > len(g):  # padding rows (model.make_vocab_size_divisible_by) make no logit
                    if np.any(ours[len(g):]):
                        print(f"FAIL {name}'s padding rows have a gradient in {ck}")
                        failed += 1
                    ours = ours[:len(g)]
                e = np.linalg.norm(ours - g) / max(np.linalg.norm(g), 1e-30)
                if e > worst:
                    worst, where = e, name
        layout = json.loads(h5py.File(ck, "r").attrs["config"])
        tag = f"tp {layout['tensor_parallel']['tp_size']} pp {layout['pipeline_parallel']['pp_size']}"
        if layout["model"].get("make_vocab_size_divisible_by", 1) > 1:
            tag += f", vocabulary padded to a multiple of {layout['model']['make_vocab_size_divisible_by']}"
        print(f"gradients ({tag}, {os.path.basename(ck)}): worst norm-wise relative difference {worst:.2e} ({where})")
        if worst > 1e-5:
            print(f"FAIL gradients of {ck}")
            failed += 1
    generated = os.environ.get("PEER_GENERATED")
    if generated:  # zero3d generate --temperature 0 (KV cache) against greedy decoding here (whole prefix)
        ids, n_prompt = [int(t) for t in generated.split()], int(os.environ["PEER_PROMPT"])
        with torch.no_grad():
            for i in range(n_prompt, len(ids)):
                logits = model.logits(torch.tensor([ids[:i]]))[0, -1]
                best = int(logits.argmax())
                if best != ids[i]:
                    margin = float(logits[best] - logits[ids[i]])
                    tie = margin <= 1e-5 * float(logits.abs().max())
                    print(f"{'tie' if tie else 'FAIL'} at generated token {i - n_prompt}: zero3d {ids[i]}, PyTorch {best} "
                          f"(logit margin {margin:.2e})")
                    failed += 0 if tie else 1
                    break
            else:
                print(f"generate: the {len(ids) - n_prompt} greedy tokens of zero3d (KV cache) match PyTorch's")
    print(f"peer_check: {'FAIL' if failed else 'ok'} ({cfg['architectures'][0]}, {len(z)} tensors, {len(ckpts)} layouts)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
