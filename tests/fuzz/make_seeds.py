#!/usr/bin/env python3
"""Writes small seed inputs for each fuzz target from the real files in the data folder.

Usage: make_seeds.py DATA_DIR REPO_DIR OUT_DIR. Each target gets OUT_DIR/<target>/; the
real files are cut down (few tensors, a few hundred vocabulary entries, a few lines) so
that every seed is still valid input but small enough to mutate quickly.
"""
import json
import os
import struct
import sys
import zipfile

data, repo, out = sys.argv[1:4]


def write(target, name, payload):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(payload if isinstance(payload, bytes) else payload.encode())


models = os.path.join(data, "models")
model_dirs = sorted(d for d in os.listdir(models) if os.path.isdir(os.path.join(models, d)))

# safetensors: a valid file rebuilt from the smallest tensors of each real checkpoint
# (selector byte 0), and each real index (selector byte 1).
for d in model_dirs:
    path = os.path.join(models, d, "model.safetensors")
    if os.path.exists(path):
        blob = open(path, "rb").read()
        n = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        body = blob[8 + n:]
        small = sorted((k for k in header if k != "__metadata__"),
                       key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])[:3]
        new_header, chunks, offset = {}, [], 0
        for k in small:
            b, e = header[k]["data_offsets"]
            chunks.append(body[b:e])
            new_header[k] = dict(header[k], data_offsets=[offset, offset + e - b])
            offset += e - b
        text = json.dumps(new_header, separators=(",", ":")).encode()
        text += b" " * ((8 - (len(text) + 8) % 8) % 8)
        write("safetensors", d, b"\0" + struct.pack("<Q", len(text)) + text + b"".join(chunks))
    index = os.path.join(models, d, "model.safetensors.index.json")
    if os.path.exists(index):
        write("safetensors", d + "-index", b"\1" + open(index, "rb").read())

# config.json of every model.
for d in model_dirs:
    path = os.path.join(models, d, "config.json")
    if os.path.exists(path):
        write("config_json", d, open(path, "rb").read())

# tokenizer.model (SentencePiece): the small stories260K one as it is.
write("sentencepiece", "stories260K", open(os.path.join(models, "stories260K-hf", "tokenizer.model"), "rb").read())


def trimmed_vocab(vocab, merges, keep):
    vocab = {t: i for t, i in vocab.items() if i < keep}
    kept_merges = []
    for m in merges:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            kept_merges.append(m)
    return vocab, kept_merges


# tokenizer.json: each real one with its vocabulary cut to 400 entries.
for name in ("gpt-neox-20b", "llama3", "qwen3"):
    path = os.path.join(data, "tokenizers", name, "tokenizer.json")
    if not os.path.exists(path):
        continue
    tok = json.load(open(path, encoding="utf-8"))
    tok["model"]["vocab"], tok["model"]["merges"] = trimmed_vocab(tok["model"]["vocab"], tok["model"]["merges"], 400)
    tok["added_tokens"] = [dict(t, id=400 + i) for i, t in enumerate(tok.get("added_tokens", [])[:3])]
    write("bpe_json", name, json.dumps(tok, ensure_ascii=False))

# tokenizer.json's added tokens and Split regex (fuzz_bpe_added_tokens): FLAGS REGEX \0
# ADDED_TOKENS \0 TEXT over the target's own 260-token vocabulary, so added ids start at 260.
sample = "Once upon a time, the cat sat.\n  123 \u00e9l\u00e8ve 4567 \u4f60\u597d!! "
for name in ("llama3", "qwen3", "gpt-neox-20b"):
    path = os.path.join(data, "tokenizers", name, "tokenizer.json")
    if not os.path.exists(path):
        continue
    tok = json.load(open(path, encoding="utf-8"))
    pre = tok.get("pre_tokenizer") or {}
    regex = ""
    for step in pre.get("pretokenizers", []):
        if step.get("type") == "Split":
            regex = step["pattern"]["Regex"]
    added = [dict(t, id=260 + i) for i, t in enumerate(tok.get("added_tokens", [])[:4])]
    text = sample + "".join(t["content"] for t in added[:2]) + " the" + sample
    flags = (1 if regex else 0) | (2 if (tok.get("normalizer") or {}).get("type") == "NFC" else 0)
    write("bpe_added_tokens", name, bytes([flags]) + regex.encode() + b"\0" +
          json.dumps(added, ensure_ascii=False).encode() + b"\0" + text.encode())
# A regex that backtracks without bound, and added-token lists the loader refuses.
write("bpe_added_tokens", "catastrophic-regex", b"\1(a+)+$|(\\s*)*x\0[]\0" + b"a" * 40 + b"!")
write("bpe_added_tokens", "empty-regex", b"\1\0[]\0the cat")
for label, tokens in (("id-2-31", [{"content": "<|x|>", "id": 2 ** 31}]),
                      ("content-twice", [{"content": "<|x|>", "id": 260}, {"content": "<|x|>", "id": 261}]),
                      ("id-twice", [{"content": "<|x|>", "id": 260}, {"content": "<|y|>", "id": 260}]),
                      ("vocab-id", [{"content": "<|x|>", "id": 5}]),
                      ("in-vocab", [{"content": "aa", "id": 259, "special": True, "normalized": False}])):
    write("bpe_added_tokens", label, b"\0\0" + json.dumps(tokens).encode() + b"\0<|x|>aa<|y|> the")

# vocab.json + merges.txt (GPT-2), joined by a NUL byte as fuzz_bpe_vocab_merges reads them.
gpt2 = os.path.join(data, "tokenizers", "gpt2")
vocab = json.load(open(os.path.join(gpt2, "vocab.json"), encoding="utf-8"))
lines = open(os.path.join(gpt2, "merges.txt"), encoding="utf-8").read().split("\n")
merges = [l for l in lines[1:] if l]
vocab, merges = trimmed_vocab(vocab, merges, 400)
write("bpe_vocab_merges", "gpt2", json.dumps(vocab, ensure_ascii=False) + "\0" + lines[0] + "\n" + "\n".join(merges) + "\n")

# Task JSONL: the first lines of every task file.
for task in sorted(os.listdir(data)):
    folder = os.path.join(data, task)
    if not os.path.isdir(folder) or task in ("models", "tokenizers", "golden", "text"):
        continue
    for f in sorted(os.listdir(folder)):
        if f.endswith(".jsonl"):
            with open(os.path.join(folder, f), "rb") as src:
                head = b"".join(src.readline() for _ in range(3))
            write("task_jsonl", task + "-" + f, head[:4096])

# results.csv: the header and first rows of each reference result in the repository.
results = os.path.join(repo, "results")
for d in sorted(os.listdir(results)) if os.path.isdir(results) else []:
    path = os.path.join(results, d, "results.csv")
    if os.path.exists(path):
        with open(path, "rb") as src:
            write("results_csv", d, b"".join(src.readline() for _ in range(6)))

# pytorch_model.bin: each real checkpoint's state-dict pickle, and a small zip holding
# it the way torch.save lays records out (stored, uncompressed).
for d in model_dirs:
    path = os.path.join(models, d, "pytorch_model.bin")
    if not os.path.exists(path):
        continue
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            pkl = [n for n in z.namelist() if n.endswith("data.pkl")][0]
            prefix = pkl[: -len("data.pkl")]
            pickle_bytes = z.read(pkl)
            write("pytorch_bin", d + "-data.pkl", pickle_bytes)
            import io
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as small:
                small.writestr(prefix + "data.pkl", pickle_bytes)
                small.writestr(prefix + "version", "3\n")
                for n in z.namelist()[:4]:
                    if "/data/" in n:
                        small.writestr(n, z.read(n)[:64])
            write("pytorch_bin", d + "-small.zip", buffer.getvalue())
    else:
        write("pytorch_bin", d + "-legacy-head", open(path, "rb").read()[:8192])

# Hand-made pickles at the reader's limits: lists nested 1,200 deep (past the 1,000-level
# bound), one list twice in a tuple through the memo (allowed), a dict put inside itself
# and a list appended to itself (cycles, refused).
write("pytorch_bin", "nested-lists", b"\x80\x02" + b"]" * 1200 + b"a" * 1199 + b".")
write("pytorch_bin", "memo-shared-list", b"\x80\x02]q\x00h\x00\x86.")
write("pytorch_bin", "dict-holds-itself", b"\x80\x02}q\x00(X\x01\x00\x00\x00ah\x00X\x01\x00\x00\x00bh\x00u.")
write("pytorch_bin", "self-append", b"\x80\x02]q\x00h\x00a.")

# Sweep configs: every config in the repository as it is, and the config each reference
# result was run with (the "config" member of results/*/config.json).
configs = os.path.join(repo, "configs")
for f in sorted(os.listdir(configs)) if os.path.isdir(configs) else []:
    if f.endswith(".json"):
        write("sweep_config", f, open(os.path.join(configs, f), "rb").read())
for d in sorted(os.listdir(results)) if os.path.isdir(results) else []:
    path = os.path.join(results, d, "config.json")
    if os.path.exists(path):
        record = json.load(open(path))
        if isinstance(record, dict) and isinstance(record.get("config"), dict):
            write("sweep_config", "results-" + d, json.dumps(record["config"], indent=1))

# results.csv -> exports: the same reference results.
for d in sorted(os.listdir(results)) if os.path.isdir(results) else []:
    path = os.path.join(results, d, "results.csv")
    if os.path.exists(path):
        with open(path, "rb") as src:
            write("results_export", d, b"".join(src.readline() for _ in range(12)))

# Slurm state: slurm/sweep.json as `kvevict sweep --slurm` writes it, around small
# configs (each reference result's, and a hand-made one), with one submission.
small_configs = [{"tasks": ["copa"], "policies": ["full", "h2o"], "budgets": [0.2, 0.5], "limit": 2}]
for d in sorted(os.listdir(results)) if os.path.isdir(results) else []:
    path = os.path.join(results, d, "config.json")
    if os.path.exists(path):
        record = json.load(open(path))
        if isinstance(record, dict) and isinstance(record.get("config"), dict):
            small_configs.append(record["config"])
for i, config in enumerate(small_configs[:6]):
    record = {"kvevict": "/usr/bin/kvevict", "config_path": "/work/sweep.json", "config": config, "shards": 2,
              "cells": 3, "data_dir": "", "sweep_overrides": ["--limit", "2"],
              "submissions": [{"array_job": "100", "shards": [0, 1], "submitted": "2026-01-01T00:00:00Z",
                               "sbatch_options": {"partition": "gpu", "time": "1:00:00"}, "merge_job": "101"}]}
    write("slurm_record", "record-%d" % i, json.dumps(record, indent=1))

# analyze configs: the repository's configs that have an "analyze" list, and a small one.
for f in sorted(os.listdir(configs)) if os.path.isdir(configs) else []:
    if f.endswith(".json") and "analyze" in json.load(open(os.path.join(configs, f))):
        write("analyze_config", f, open(os.path.join(configs, f), "rb").read())
write("analyze_config", "small", json.dumps({"tasks": ["copa"], "analyze": [
    {"name": "text", "text_file": "text/tinystories_sample.txt", "max_tokens": 64, "deltas": [1, 4]},
    {"name": "copa", "task": "copa", "limit": 2, "recall_policies": ["h2o"], "recall_budgets": [0.2]}]}))

# Server request bodies: lm-eval's two request shapes, text prompts, the kvevict object,
# the tokenizer routes' bodies.
for name, body in [
    ("loglikelihood", {"model": "m", "prompt": [[1, 5, 6, 7], [1, 8, 9]], "temperature": 0, "max_tokens": 1,
                       "logprobs": 1, "seed": 1234, "echo": True}),
    ("generation", {"prompt": [[1, 5, 6]], "model": None, "max_tokens": 32, "temperature": 0,
                    "stop": ["\n", "</s>"], "seed": 1234}),
    ("text-stream", {"prompt": ["Once upon a time", "The cat"], "max_tokens": 8, "stream": True, "n": 1,
                     "top_p": 1, "user": "u", "logit_bias": {}, "suffix": None}),
    ("kvevict", {"prompt": "a", "echo": True, "logprobs": 5, "max_tokens": 0,
                 "kvevict": {"policy": "h2o", "budget": 0.5, "heavy_share": 0.5, "context_tokens": 3}}),
    ("kvevict-paper", {"prompt": [1, 2, 3], "kvevict": {"policy": "h2o-paper", "heavy_ratio": 0.1,
                                                         "recent_ratio": 0.1}}),
    ("kvevict-params", {"prompt": "x", "kvevict": {"policy": "streaming", "budget_tokens": 8, "n_sink": 4}}),
    ("tokenize", {"prompt": "Once upon a time", "add_special_tokens": False}),
    ("detokenize", {"tokens": [1, 5, 6, 511]}),
]:
    write("server_request", name, json.dumps(body))
    # The same bodies as whole HTTP requests, for the framing in front of the parser.
    raw = json.dumps(body)
    write("server_request", name + "-http", "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
          "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(raw.encode()), raw))
write("server_request", "pipelined-http", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n\r\nPOST /tokenize HTTP/1.1\r\n"
      "Expect: 100-continue\r\nContent-Length: 13\r\n\r\n{\"prompt\":\"\"}")
write("server_request", "bad-length-http", "POST /v1/completions HTTP/1.1\r\nContent-Length: 12345678901234567890\r\n"
      "Content-Length: -1\r\nTransfer-Encoding: chunked\r\n\r\n")
write("server_request", "duplicate-key", '{"prompt": "a", "prompt": "b"}')
write("server_request", "huge-number", '{"prompt": "a", "temperature": 1e400, "max_tokens": 18446744073709551615}')
# DuoAttention pattern files: TSV, CSV and JSON of [layer][KV head] scores (2 x 2 fits the
# fuzz target's shape), and a ragged one.
write("duo_pattern", "tsv", "0.9\t0.1\n0.2\t0.8\n")
write("duo_pattern", "csv", "0.9,0.1\n0.2,0.8\n")
write("duo_pattern", "json", "[[0.9, 0.1], [0.2, 0.8]]")
write("duo_pattern", "ragged", "0.9\t0.1\n0.2\n")
