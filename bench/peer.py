#!/usr/bin/env python3
"""kvevict against llama.cpp on the same random weights, on the same machine (issue 41).

  /usr/bin/python3 bench/peer.py [--config configs/bench_peer.json] [--llama-cpp DIR]

For each model shape of the config, writes one random LLaMA checkpoint with
`kvevict make-random-model` (Hugging Face safetensors, F32) and the same weights as GGUF
files (F32 and BF16, bench/write_peer_gguf.py with llama.cpp's gguf-py), then times each
row with kvevict and then with llama.cpp, alternating, `repeat` rounds, each keeping its
best: decode tokens/s at each batch size (every sequence after its own `decode_prompt`
tokens, `decode_tokens` steps; llama-batched-bench) and prefill tokens/s at each length
(llama-bench; kvevict also under the eviction policies, which llama.cpp lacks). The
machine's limits are measured in the same run by kvevict (read bandwidth: batch-1
decode's limit; the FMA peak: large batches' and prefill's) and every row is shown as a
share of the roofline those give. Both run on `threads` threads.

With --baseline BINARY, an earlier kvevict build runs each row too, in the same rounds,
so one run gives the table before and after a change (its own columns).

llama.cpp is a peer only: built outside this repository (README "Against llama.cpp"),
found by --llama-cpp DIR or LLAMA_CPP_DIR (DIR/build/bin/llama-bench and
llama-batched-bench, DIR/gguf-py). Without it, the bench says how to build it and
leaves its column empty.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_KEYS = {"comment", "description", "shapes", "dtypes", "decode_batch_sizes", "decode_prompt", "decode_tokens",
               "prefill_tokens", "prefill_policies", "prefill_protocols", "decode_policies", "budget", "repeat",
               "threads",
               "bandwidth_MiB", "llama_cpp_flash_attn"}
PROTOCOLS = ("prefill-compress", "stream")
SHAPE_KEYS = {"layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"}
GGUF_TYPE = {"float32": "f32", "bfloat16": "bf16"}
BUILD_HINT = """llama.cpp is not built, so its column is left empty. To build it (outside this repository):
  git clone https://github.com/ggml-org/llama.cpp /work/llama.cpp
  cmake -S /work/llama.cpp -B /work/llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
  cmake --build /work/llama.cpp/build -j --target llama-batched-bench llama-bench
then pass --llama-cpp /work/llama.cpp (or set LLAMA_CPP_DIR)."""


def fail(message):
    sys.exit(f"peer: {message}")


def log(message):
    print(message, flush=True)


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def read_config(path):
    with open(path) as f:
        config = json.load(f)
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        fail(f"{path}: unknown key \"{unknown[0]}\" (known: {', '.join(sorted(CONFIG_KEYS))})")
    for name, shape in config.get("shapes", {}).items():
        unknown = sorted(set(shape) - SHAPE_KEYS)
        missing = sorted(SHAPE_KEYS - set(shape))
        if unknown or missing:
            fail(f"{path}: shapes.{name}: " + (f"unknown key \"{unknown[0]}\"" if unknown else f"missing \"{missing[0]}\""))
    for protocol in config.get("prefill_protocols", []):
        if protocol not in PROTOCOLS:
            fail(f"{path}: prefill_protocols: \"{protocol}\" is not one of {list(PROTOCOLS)}")
    for dtype in config.get("dtypes", []):
        if dtype not in GGUF_TYPE:
            fail(f"{path}: dtypes: \"{dtype}\" is not one of {sorted(GGUF_TYPE)}")
    return config


def run(command, env=None):
    """stdout of a command; its stderr's tail in the error when it fails."""
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        fail(f"{shlex.join(command)} failed (exit {result.returncode}):\n{tail}")
    return result.stdout


def parse_row(line):
    """'peer_row KIND k1 v1 k2 v2 ...' -> {'kind': KIND, k1: v1, ...} (numbers as floats)."""
    words = line.split()
    row = {"kind": words[1]}
    for key, value in zip(words[2::2], words[3::2]):
        try:
            row[key] = float(value)
        except ValueError:
            row[key] = value
    return row


class Kvevict:
    def __init__(self, binary, threads):
        self.binary, self.threads = binary, threads

    def rows(self, model, dtype, rows):
        """One `kvevict bench` process for these rows of one model and dtype."""
        config = {"description": "written by bench/peer.py", "dtype": dtype, "peer_rows": rows}
        if model:
            config["model"] = model
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(config, f)
        try:
            out = run([self.binary, "bench", "--config", f.name, "--threads", str(self.threads)])
        finally:
            os.unlink(f.name)
        return [parse_row(line) for line in out.splitlines() if line.startswith("peer_row ")]


class LlamaCpp:
    def __init__(self, folder, threads, flash_attn):
        self.folder, self.threads, self.flash_attn = folder, threads, flash_attn
        self.bench = os.path.join(folder, "build", "bin", "llama-bench")
        self.batched = os.path.join(folder, "build", "bin", "llama-batched-bench")
        self.gguf_py = os.path.join(folder, "gguf-py")

    def available(self):
        return all(os.access(p, os.X_OK) for p in (self.bench, self.batched)) and os.path.isdir(self.gguf_py)

    def decode(self, gguf, batch, prompt, tokens):
        """Decode tokens/s of `batch` sequences, each after its own prompt (llama-batched-bench)."""
        out = run([self.batched, "-m", gguf, "-c", str(batch * (prompt + tokens)), "-npp", str(prompt),
                   "-ntg", str(tokens), "-npl", str(batch), "-t", str(self.threads), "-tb", str(self.threads),
                   "-fa", self.flash_attn, "--output-format", "jsonl"])
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if len(rows) != 1:
            fail(f"llama-batched-bench printed {len(rows)} result rows, expected 1")
        return rows[0]["speed_tg"]

    def prefill(self, gguf, tokens):
        """Prompt tokens/s at `tokens` (llama-bench pp, one run, no warm-up run)."""
        out = run([self.bench, "-m", gguf, "-p", str(tokens), "-n", "0", "-t", str(self.threads), "-r", "1",
                   "-fa", "1" if self.flash_attn == "on" else "0", "--no-warmup", "-o", "jsonl"])
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if len(rows) != 1:
            fail(f"llama-bench printed {len(rows)} result rows, expected 1")
        return rows[0]["avg_ts"]


def make_models(kvevict_binary, llama, folder, name, shape, max_positions, dtypes):
    """The safetensors checkpoint and its GGUF files, each written only when missing."""
    model = os.path.join(folder, name)
    wanted = {"num_hidden_layers": shape["layers"], "hidden_size": shape["hidden"],
              "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"],
              "intermediate_size": shape["intermediate"], "vocab_size": shape["vocab"]}
    try:
        with open(os.path.join(model, "config.json")) as f:
            written = json.load(f)
        fits = (all(written.get(k) == v for k, v in wanted.items()) and
                written.get("max_position_embeddings", 0) >= max_positions and
                os.path.isfile(os.path.join(model, "model.safetensors")))
    except (OSError, ValueError):
        fits = False
    if not fits:  # missing, another shape, or too short for the longest prefill
        log(f"writing {model} (kvevict make-random-model)")
        run([kvevict_binary, "make-random-model", "--out", model, "--layers", str(shape["layers"]),
             "--hidden", str(shape["hidden"]), "--heads", str(shape["heads"]), "--kv-heads", str(shape["kv_heads"]),
             "--intermediate", str(shape["intermediate"]), "--vocab", str(shape["vocab"]),
             "--max-positions", str(max_positions)])
    ggufs = {}
    if llama:
        for dtype in dtypes:
            path = os.path.join(model, f"model-{GGUF_TYPE[dtype]}.gguf")
            if not os.path.isfile(path) or os.path.getmtime(path) < os.path.getmtime(os.path.join(model, "model.safetensors")):
                log(f"writing {path}")
                run([sys.executable, os.path.join(REPO, "bench", "write_peer_gguf.py"), "--model", model, "--out", path,
                     "--type", GGUF_TYPE[dtype], "--gguf-py", llama.gguf_py])
            ggufs[dtype] = path
    return model, ggufs


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def share(value, limit):
    return f"{100 * value / limit:.0f}%" if value and limit else "-"


def label_of(spec, budget):
    if "decode_batch" in spec:
        policy = f" {spec['policy']} {budget}" if spec.get("policy", "full") != "full" else ""
        return f"decode B={spec['decode_batch']}{policy}"
    policy = "" if spec["policy"] == "full" else f" {spec['policy']} {budget} {spec.get('protocol', PROTOCOLS[0])}"
    return f"prefill T={spec['prefill']}{policy}"


def baseline_reads(spec):
    """Whether a kvevict from before the decode rows' policy and the prefill rows' protocol takes the row."""
    return "protocol" not in spec and not ("decode_batch" in spec and "policy" in spec)


def fmt(value):
    return f"{value:.1f}" if value else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "bench_peer.json"))
    parser.add_argument("--kvevict", default=os.path.join(REPO, "build", "kvevict"), help="the kvevict binary")
    parser.add_argument("--baseline", help="an earlier kvevict binary, measured in the same rounds (before/after)")
    parser.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR", ""),
                        help="llama.cpp checkout with build/bin (default: $LLAMA_CPP_DIR)")
    parser.add_argument("--models", default=os.path.join(REPO, "build", "peer"), help="where the checkpoints are written")
    parser.add_argument("--shapes", help="comma-separated shape names of the config (default: all)")
    parser.add_argument("--dtypes", help="comma-separated, overrides the config's")
    parser.add_argument("--batch-sizes", help="comma-separated, overrides decode_batch_sizes")
    parser.add_argument("--prefill", help="comma-separated prefill lengths, overrides prefill_tokens (0: none)")
    parser.add_argument("--prefill-policies", help="comma-separated, overrides prefill_policies ('' for none)")
    parser.add_argument("--decode-policies", help="comma-separated, overrides decode_policies ('' for none)")
    parser.add_argument("--decode-tokens", type=int, help="overrides decode_tokens")
    parser.add_argument("--repeat", type=int, help="rounds of each row, overrides repeat")
    parser.add_argument("--threads", type=int, help="overrides threads")
    parser.add_argument("--write-only", action="store_true", help="write the checkpoints and stop")
    args = parser.parse_args()

    config = read_config(args.config)
    ints = lambda text: [int(x) for x in text.split(",") if x.strip() and int(x) > 0]
    shapes = config.get("shapes", {})
    if args.shapes:
        for name in args.shapes.split(","):
            if name not in shapes:
                fail(f"--shapes: \"{name}\" is not a shape of {args.config} ({', '.join(shapes)})")
        shapes = {name: shapes[name] for name in args.shapes.split(",")}
    dtypes = args.dtypes.split(",") if args.dtypes else config.get("dtypes", ["float32", "bfloat16"])
    for dtype in dtypes:
        if dtype not in GGUF_TYPE:
            fail(f"--dtypes: \"{dtype}\" is not one of {sorted(GGUF_TYPE)}")
    batches = ints(args.batch_sizes) if args.batch_sizes else config.get("decode_batch_sizes", [1, 2, 4, 8, 16, 32])
    prefills = ints(args.prefill) if args.prefill is not None else config.get("prefill_tokens", [512, 2048, 8192])
    policies = ([p for p in args.prefill_policies.split(",") if p] if args.prefill_policies is not None
                else config.get("prefill_policies", []))
    decode_policies = ([p for p in args.decode_policies.split(",") if p] if args.decode_policies is not None
                       else config.get("decode_policies", []))
    prompt = config.get("decode_prompt", 32)
    steps = args.decode_tokens or config.get("decode_tokens", 64)
    repeat = args.repeat or config.get("repeat", 3)
    threads = args.threads or config.get("threads", 2)
    budget = config.get("budget", 0.2)
    protocols = config.get("prefill_protocols", [PROTOCOLS[0]])
    flash_attn = config.get("llama_cpp_flash_attn", "on")
    if flash_attn not in ("on", "off"):
        fail(f"{args.config}: llama_cpp_flash_attn must be \"on\" or \"off\"")
    if not os.access(args.kvevict, os.X_OK):
        fail(f"--kvevict {args.kvevict}: no such binary (cmake --build build --target kvevict)")

    kvevict = Kvevict(args.kvevict, threads)
    if args.baseline and not os.access(args.baseline, os.X_OK):
        fail(f"--baseline {args.baseline}: no such binary")
    baseline = Kvevict(args.baseline, threads) if args.baseline else None
    llama = LlamaCpp(args.llama_cpp, threads, flash_attn) if args.llama_cpp else None
    if llama and not llama.available():
        log(f"--llama-cpp {args.llama_cpp}: no build/bin/llama-bench and llama-batched-bench there")
        llama = None
    if not llama:
        log(BUILD_HINT)

    if args.write_only:
        max_positions = max([prompt + steps] + prefills + config.get("prefill_tokens", [])) + 16
        for name, shape in shapes.items():
            model, ggufs = make_models(args.kvevict, llama, args.models, name, shape, max_positions, dtypes)
            log(f"{name}: {model} " + " ".join(ggufs.values()))
        return
    log(f"threads {threads} repeat {repeat} load_average {load_average()} llama.cpp "
        f"{args.llama_cpp if llama else 'none'} flash_attn {flash_attn if llama else '-'}")
    limits_row = {"limits": True}
    if "bandwidth_MiB" in config:
        limits_row["bandwidth_MiB"] = config["bandwidth_MiB"]
    limits = kvevict.rows(None, "float32", [limits_row])[0]
    log(f"limits (start) read_GB_per_s {limits['read_GB_per_s']:.1f} fma_f32_GFLOP_per_s "
        f"{limits['fma_f32_GFLOP_per_s']:.1f} ({limits['fma_isa']}) bf16_dot_GFLOP_per_s "
        f"{limits.get('bf16_dot_GFLOP_per_s', 0):.1f} load_average {load_average()}")

    # Room for the config's longest prefill even when this run asks for shorter ones, so
    # that a short run's checkpoint serves the full table too.
    max_positions = max([prompt + steps] + prefills + config.get("prefill_tokens", [])) + 16
    measured = []
    readings = [limits]
    started = time.time()
    for name, shape in shapes.items():
        model, ggufs = make_models(args.kvevict, llama, args.models, name, shape, max_positions, dtypes)
        for dtype in dtypes:
            rows = []
            for b in batches:
                rows.append({"decode_batch": b, "prompt": prompt, "tokens": steps})
                rows += [{"decode_batch": b, "prompt": prompt, "tokens": steps, "policy": p, "budget": budget}
                         for p in decode_policies]
            for t in prefills:
                rows.append({"prefill": t, "policy": "full"})
                for p in policies:
                    for protocol in protocols:
                        row = {"prefill": t, "policy": p, "budget": budget}
                        if protocol != PROTOCOLS[0]:  # the default: a baseline older than the key reads the row
                            row["protocol"] = protocol
                        rows.append(row)
            # The limits again after each dtype's rows: on a shared machine a probe that
            # falls in a busy stretch reads low, and the table uses the highest reading.
            readings.append(kvevict.rows(None, "float32", [limits_row])[0])
            for spec in rows:
                best_k, best_l, best_b, kv_row = 0.0, 0.0, 0.0, None
                for _ in range(repeat):
                    if baseline and baseline_reads(spec):
                        best_b = max(best_b, baseline.rows(model, dtype, [spec])[0]["tokens_per_s"])
                    got = kvevict.rows(model, dtype, [spec])[0]
                    if got["tokens_per_s"] > best_k:
                        best_k, kv_row = got["tokens_per_s"], got
                    if llama and spec.get("policy", "full") == "full":
                        if "decode_batch" in spec:
                            speed = llama.decode(ggufs[dtype], spec["decode_batch"], prompt, steps)
                        else:
                            speed = llama.prefill(ggufs[dtype], spec["prefill"])
                        best_l = max(best_l, speed)
                measured.append((name, dtype, spec, best_k, best_l, best_b, kv_row, load_average()))
                before = f" baseline {fmt(best_b)}" if baseline else ""
                log(f"row {name} {dtype} {label_of(spec, budget)} kvevict {fmt(best_k)} llama.cpp {fmt(best_l)} "
                    f"ratio {ratio(best_k, best_l)}{before} load_average {load_average()}")
    end = kvevict.rows(None, "float32", [limits_row])[0]
    log(f"limits (end) read_GB_per_s {end['read_GB_per_s']:.1f} fma_f32_GFLOP_per_s {end['fma_f32_GFLOP_per_s']:.1f} "
        f"load_average {load_average()} minutes {(time.time() - started) / 60:.1f}")
    # A limit is an upper bound: of the readings, the highest is the nearest.
    readings.append(end)
    bandwidth = max(r["read_GB_per_s"] for r in readings) * 1e9
    fma = max(r["fma_f32_GFLOP_per_s"] for r in readings) * 1e9
    log(f"roofline from read {bandwidth / 1e9:.1f} GB/s and FMA {fma / 1e9:.1f} GFLOP/s (the highest of "
        f"{len(readings)} readings; read {min(r['read_GB_per_s'] for r in readings):.1f}-{bandwidth / 1e9:.1f}, "
        f"FMA {min(r['fma_f32_GFLOP_per_s'] for r in readings):.1f}-{fma / 1e9:.1f})")
    # bfloat16 rows: the faster of the machine's two ways to multiply bfloat16 is their
    # compute limit, whatever either engine uses: the AVX512-BF16 dot product where the CPU
    # has it (twice the float32 FMA rate on Zen 4, half of it on the Xeon here), or float32
    # FMAs on widened values (exact).
    bf16_dot = max(r.get("bf16_dot_GFLOP_per_s", 0) for r in readings) * 1e9
    # An evicting row against the full cache's row of the same shape, dtype and batch or length.
    full_speed = {(n, d, s.get("decode_batch"), s.get("prefill")): k for n, d, s, k, *_ in measured
                  if s.get("policy", "full") == "full"}
    table = []
    for name, dtype, spec, best_k, best_l, best_b, kv_row, load in measured:
        full = full_speed.get((name, dtype, spec.get("decode_batch"), spec.get("prefill")))
        of_full = "-" if spec.get("policy", "full") == "full" else ratio(best_k, full)
        peak, peak_name = (bf16_dot, "bf16 dot") if dtype == "bfloat16" and bf16_dot > fma else (fma, "FMA")
        # The roofline: a decode step reads the weights once and each sequence's cache
        # (about prompt + steps/2 rows) and does its products; a prefill is bound by its FLOPs.
        if "decode_batch" in spec:
            b = spec["decode_batch"]
            context = prompt + steps / 2
            step_bytes = kv_row["weight_bytes"] + b * kv_row["kv_bytes_per_token"] * context
            step_flops = b * (kv_row["linear_flops_per_token"] + kv_row["attention_flops_per_pair"] * context)
            limit = b / max(step_bytes / bandwidth, step_flops / peak)
            bound = "bandwidth" if step_bytes / bandwidth > step_flops / peak else peak_name
            attention = kv_row["attention_ms"] / kv_row["step_ms"]
        else:
            limit = spec["prefill"] * peak / kv_row["flops"]
            bound = peak_name
            attention = kv_row["attention_seconds"] / kv_row["seconds"]
        before = [fmt(best_b), ratio(best_b, best_l)] if baseline else []
        table.append([name, dtype, label_of(spec, budget)] + before + [fmt(best_k), fmt(best_l), ratio(best_k, best_l),
                     of_full, fmt(limit), bound, share(best_k, limit), share(best_l, limit), f"{100 * attention:.0f}%",
                     load])
    header = ["shape", "dtype", "row"] + (["baseline tok/s", "baseline/llama.cpp"] if baseline else []) + [
        "kvevict tok/s", "llama.cpp tok/s", "kvevict/llama.cpp", "of full cache", "roofline tok/s", "bound",
        "kvevict of roofline",
        "llama.cpp of roofline", "kvevict attention", "load average"]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for entry in table:
        print("| " + " | ".join(entry) + " |")


if __name__ == "__main__":
    main()
