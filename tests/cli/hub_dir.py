"""tests/cli/hub_dir.py: a Hugging Face directory shaped as the hub ships it, made from a zero3d export
(`zero3d ckpt export --format hf`), for checkpoint.init_from's tests (tests/cli/test_hf.sh).

  hub_dir(export, out, **how)   writes out/config.json and the weights; `how`:
    prefix=False         names without GPT-2's `transformer.` / Llama's `model.` (as GPT2Model,
                         LlamaModel and the hub's openai-community/gpt2 files have them)
    shards=N             N files model-0000i-of-0000N.safetensors and model.safetensors.index.json
    dtype="BF16"|"F16"   the weights rounded to it (round to nearest even)
    positions=P          GPT-2: n_positions P > seq_len, wpe grown by P - seq_len rows of noise
    buffers=True         the buffers transformers saves with no weights: GPT-2's attn.bias
                         (1, 1, P, P) and attn.masked_bias, Llama's rotary_emb.inv_freq
    head="equal"|"other" a tied model's file with lm_head.weight: the embedding, or not quite
    tie=True             Llama: tied (lm_head.weight dropped unless `head`)
    extra=NAME           one tensor no model has
    drop=NAME            one tensor left out
    reshape=(NAME, SHAPE) one tensor's shape (its data cut or grown to it)
    config={...}         keys set (None: removed) after the hub's keys are written
  rounded(export, out, dtype, tie=False)   the export as it is (zero3d's names, F32) with its
                                values rounded to dtype (tie: a Llama export made tied, its
                                lm_head.weight dropped): the reference a hub directory must equal.

The config holds what the hub's files hold and leaves out the keys at transformers' defaults
(GPT2Config, LlamaConfig), as the hub's files often do.
"""
import json
import os
import struct

import numpy as np

from z3dcheck import f32_tensors


def to_16(a, dtype):
    """(uint16 bits, the float32 values they hold) of a rounded to BF16 or F16, nearest even."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F16":
        h = a.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def rounded_value(a, dtype):
    return a if dtype == "F32" else to_16(a, dtype)[1].reshape(a.shape)


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: name -> float32 array (written as dtype) or (dtype, bytes, shape) as it is."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dt, raw, shape = t
        else:
            dt, shape = dtype, list(t.shape)
            raw = (np.ascontiguousarray(t, "<f4") if dtype == "F32" else to_16(t, dtype)[0]).tobytes()
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def rounded(export, out, dtype, tie=False):
    os.makedirs(out, exist_ok=True)
    t = {k: rounded_value(v, dtype) for k, v in f32_tensors(os.path.join(export, "model.safetensors")).items()}
    cfg = json.load(open(os.path.join(export, "config.json")))
    if tie:
        cfg["tie_word_embeddings"] = True
        del t["lm_head.weight"]
    write_safetensors(os.path.join(out, "model.safetensors"), t)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def hub_config(z, gpt2, positions, tie):
    """The keys a hub config.json holds, less those at transformers' defaults."""
    if gpt2:
        c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "attn_pdrop": 0.1, "embd_pdrop": 0.1,
             "resid_pdrop": 0.1, "bos_token_id": z["vocab_size"] - 1, "eos_token_id": z["vocab_size"] - 1,
             "initializer_range": 0.02, "n_ctx": positions, "n_embd": z["n_embd"], "n_head": z["n_head"],
             "n_layer": z["n_layer"], "n_positions": positions, "summary_activation": None,
             "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
             "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
             "vocab_size": z["vocab_size"]}
        if not tie:
            c["tie_word_embeddings"] = False
        return c
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_dropout": 0.0, "bos_token_id": 1,
         "eos_token_id": 2, "head_dim": z["head_dim"], "hidden_size": z["hidden_size"], "initializer_range": 0.02,
         "intermediate_size": z["intermediate_size"], "num_attention_heads": z["num_attention_heads"],
         "num_hidden_layers": z["num_hidden_layers"], "pretraining_tp": 1, "torch_dtype": "bfloat16",
         "transformers_version": "4.45.0", "use_cache": True, "vocab_size": z["vocab_size"]}
    defaults = {"num_key_value_heads": z["num_attention_heads"], "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                "max_position_embeddings": 2048, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                "tie_word_embeddings": False, "rope_scaling": None}
    for k, d in defaults.items():
        v = tie if k == "tie_word_embeddings" else z.get(k)
        if k == "max_position_embeddings":
            v = max(v, 2048)  # a longer context than the run's seq_len, at the default
        if v != d:
            c[k] = v
    return c


def hub_dir(export, out, prefix=True, shards=1, dtype="F32", positions=None, buffers=False, head=None, tie=None,
            extra=None, drop=None, reshape=None, config=None):
    os.makedirs(out, exist_ok=True)
    z = json.load(open(os.path.join(export, "config.json")))
    gpt2 = z["model_type"] == "gpt2"
    tie = z["tie_word_embeddings"] if tie is None else tie
    t = f32_tensors(os.path.join(export, "model.safetensors"))
    emb = "transformer.wte.weight" if gpt2 else "model.embed_tokens.weight"
    if gpt2 and positions:  # the context beyond seq_len: rows no run of seq_len reads
        wpe = t["transformer.wpe.weight"]
        noise = np.random.default_rng(3).normal(0, 0.02, (positions - len(wpe), wpe.shape[1])).astype(np.float32)
        t["transformer.wpe.weight"] = np.concatenate([wpe, noise])
    positions = positions or z.get("n_positions")
    if tie and "lm_head.weight" in t:
        del t["lm_head.weight"]
    if head:  # a tied model's file that also holds lm_head.weight
        t["lm_head.weight"] = t[emb].copy()
        if head == "other":
            t["lm_head.weight"][3, 5] += 0.25
    if buffers:
        layers = z.get("n_layer", z.get("num_hidden_layers"))
        for l in range(layers):
            if gpt2:
                mask = np.tril(np.ones((positions, positions), np.float32))[None, None]
                t[f"transformer.h.{l}.attn.bias"] = ("F32", mask.tobytes(), list(mask.shape))
                t[f"transformer.h.{l}.attn.masked_bias"] = ("F32", np.float32(-1e4).tobytes(), [])
            else:
                hd = z["head_dim"]
                inv = (1.0 / 10000.0 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
                t[f"model.layers.{l}.self_attn.rotary_emb.inv_freq"] = ("F32", inv.tobytes(), [hd // 2])
    if extra:
        t[extra] = np.zeros(4, np.float32)
    if drop:
        del t[drop]
    if reshape:
        name, shape = reshape
        flat = t[name].reshape(-1)
        n = int(np.prod(shape))
        t[name] = np.resize(flat, n).reshape(shape)
    if not prefix:
        strip = "transformer." if gpt2 else "model."
        t = {(k[len(strip):] if k.startswith(strip) else k): v for k, v in t.items()}
    cfg = hub_config(z, gpt2, positions, tie)
    for k, v in (config or {}).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), t, dtype)
        return
    keys = list(t)
    parts = np.array_split(np.arange(len(keys)), shards)
    weight_map = {}
    for i, part in enumerate(parts):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(out, file), {keys[j]: t[keys[j]] for j in part}, dtype)
        weight_map.update({keys[j]: file for j in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
