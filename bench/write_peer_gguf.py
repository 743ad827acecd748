#!/usr/bin/env python3
"""Writes a kvevict random LLaMA checkpoint (config.json + model.safetensors, F32, from
`kvevict make-random-model`) again as a GGUF file for llama.cpp: the same weights, so
that bench/peer.py times both engines on one model.

  PYTHONPATH=/path/to/llama.cpp/gguf-py /usr/bin/python3 bench/write_peer_gguf.py \
      --model build/peer/llama-1b --out build/peer/llama-1b/model-bf16.gguf --type bf16

gguf-py (llama.cpp's own GGUF writer, a numpy-only package) is imported from PYTHONPATH
or from --gguf-py: it is never part of this repository. Its HF converter needs
`transformers`; the file is written here tensor by tensor instead, as that converter
writes a LLaMA: the q and k projections' rows permuted from Hugging Face's rotate-half
RoPE layout to llama.cpp's adjacent-pair one (the same function), the 1-D norms kept in
F32, the matrices in the --type asked for (f32, bf16 rounded to nearest even as ggml
rounds, or f16). The vocabulary is synthetic (the random model has no tokenizer): a
SentencePiece-style list of <unk>, <s>, </s>, the 256 byte tokens and made-up pieces,
which is what llama.cpp's `llama` vocabulary needs to load; the benchmarks feed token ids.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def import_gguf(gguf_py):
    if gguf_py:
        sys.path.insert(0, gguf_py)
    try:
        import gguf  # noqa: F401
    except ImportError:
        sys.exit("write_peer_gguf: cannot import gguf: pass --gguf-py LLAMA_CPP/gguf-py "
                 "or put it on PYTHONPATH (llama.cpp's gguf-py folder)")
    return sys.modules["gguf"]


def read_safetensors(path):
    """name -> (numpy memmap, shape) of an F32 safetensors file, without reading the data."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data_start = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"write_peer_gguf: {path}: tensor {name} is {info['dtype']}, only F32 is read")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        array = np.memmap(path, dtype=np.float32, mode="r", offset=data_start + begin, shape=shape)
        assert array.nbytes == end - begin
        tensors[name] = array
    return tensors


def permute_rope_rows(weight, heads):
    """Hugging Face's rotate-half layout of a q/k projection -> llama.cpp's adjacent pairs
    (per head, row i of the first half and row i of the second half become rows 2i, 2i+1)."""
    rows = weight.shape[0]
    return (weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def gguf_names(n_layers):
    """Hugging Face LLaMA tensor name -> GGUF name."""
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight",
                 "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight",
                 "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight"}
    for layer in range(n_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{layer}.{hf}"] = f"blk.{layer}.{gg}"
    return names


def synthetic_vocab(gguf, size):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    if size < len(tokens) + 1:
        sys.exit(f"write_peer_gguf: vocab_size {size} is too small for the synthetic vocabulary (at least {len(tokens) + 1})")
    tokens += [f"\u2581tok{i}" for i in range(size - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (size - len(types))
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(size - 259)]
    return tokens, scores, types


def convert(gguf, model_dir, out_path, out_type):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "llama":
        sys.exit(f"write_peer_gguf: {model_dir}: model_type {config.get('model_type')!r}, only llama is written")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim", hidden // heads)
    if head_dim * heads != hidden:
        sys.exit("write_peer_gguf: head_dim * heads must equal hidden_size for a llama GGUF")
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    names = gguf_names(layers)
    missing = sorted(set(tensors) - set(names))
    if missing:
        sys.exit(f"write_peer_gguf: {model_dir}: tensors with no GGUF name: {missing[:3]}")

    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
                 "f16": gguf.LlamaFileType.MOSTLY_F16}[out_type]
    tmp_path = out_path + ".partial"
    writer = gguf.GGUFWriter(tmp_path, "llama")
    writer.add_name(os.path.basename(os.path.normpath(model_dir)) + " (kvevict random weights)")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(file_type)
    tokens, scores, types = synthetic_vocab(gguf, config["vocab_size"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(config.get("bos_token_id", 1))
    writer.add_eos_token_id(config.get("eos_token_id", 2))
    writer.add_add_bos_token(False)

    def converted(hf_name):
        """The tensor as written: permuted where RoPE needs it, in the file's type."""
        array = np.asarray(tensors[hf_name])
        if hf_name.endswith("q_proj.weight"):
            array = permute_rope_rows(array, heads)
        elif hf_name.endswith("k_proj.weight"):
            array = permute_rope_rows(array, kv_heads)
        array = np.ascontiguousarray(array, dtype=np.float32)
        if array.ndim == 1 or out_type == "f32":
            return array, None
        if out_type == "f16":
            return array.astype(np.float16), None
        return gguf.quants.quantize(array, gguf.GGMLQuantizationType.BF16), gguf.GGMLQuantizationType.BF16

    order = list(tensors)  # the safetensors order (the architecture's order)
    # The tensor infos first (shapes and types only), then each tensor's data in turn:
    # one tensor in memory at a time.
    for hf_name in order:
        shape, ndim = tensors[hf_name].shape, tensors[hf_name].ndim
        if ndim == 1 or out_type == "f32":
            writer.add_tensor_info(names[hf_name], shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        elif out_type == "f16":
            writer.add_tensor_info(names[hf_name], shape, np.dtype(np.float16), int(np.prod(shape)) * 2)
        else:  # bf16: the byte shape of its uint8 view
            writer.add_tensor_info(names[hf_name], (shape[0], shape[1] * 2), np.dtype(np.uint8),
                                   int(np.prod(shape)) * 2, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for hf_name in order:
        array, _ = converted(hf_name)
        writer.write_tensor_data(array)
    writer.close()
    os.replace(tmp_path, out_path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="kvevict random model folder (config.json + model.safetensors)")
    parser.add_argument("--out", required=True, help="the GGUF file to write")
    parser.add_argument("--type", choices=["f32", "bf16", "f16"], default="f32", help="the matrices' type")
    parser.add_argument("--gguf-py", default=None, help="llama.cpp's gguf-py folder (else PYTHONPATH)")
    args = parser.parse_args()
    gguf = import_gguf(args.gguf_py)
    convert(gguf, args.model, args.out, args.type)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 2**20:.0f} MiB, {args.type})")


if __name__ == "__main__":
    main()
