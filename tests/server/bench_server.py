#!/usr/bin/env python3
"""Benchmark (not a test) of `kvevict serve` on COPA-sized scoring requests.

Starts the server at each worker count, sends lm-eval's loglikelihood request (token-id
prompt, echo, max_tokens 1, logprobs 1) for every choice of the first N COPA documents
from as many concurrent clients as workers (or --clients), at each --batch-sizes (the
server's --batch-size: concurrent requests' model calls run together), and prints
requests/s. Then runs `kvevict
eval` on the same documents (one thread, the same policy) and prints the latency HTTP
adds per request: the server's mean latency with one client less eval's seconds per
request. Standard library only.

    python3 tests/server/bench_server.py BUILD/kvevict [--docs 100] [--workers 1,2] [--batch-sizes 1,4]
        [--clients N] [policy flags...]
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.environ.get("KVEVICT_DATA", os.path.join(ROOT, "..", "shared", "data"))


def start(binary, flags):
    folder = tempfile.mkdtemp(prefix="kvevict_bench_")
    port_file = os.path.join(folder, "port")
    log = open(os.path.join(folder, "stderr"), "w")
    proc = subprocess.Popen([binary, "serve", "--port", "0", "--port-file", port_file, "--threads", "1"] + flags,
                            stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(600):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, int(open(port_file).read())
        if proc.poll() is not None:
            sys.exit("kvevict serve exited: " + open(log.name).read())
        time.sleep(0.05)
    sys.exit("kvevict serve did not start")


def call(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    res = conn.getresponse()
    data = res.read()
    if res.status != 200:
        sys.exit(f"{path}: HTTP {res.status}: {data[:300]!r}")
    return json.loads(data)


def copa_requests(port, docs):
    """(context, continuation) token ids as eval encodes them: separately, no BOS."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    out = []
    with open(os.path.join(DATA, "copa", "val.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()][:docs]
    connector = {"cause": "because", "effect": "therefore"}
    for row in rows:
        context = row["premise"].strip()
        context = context[:-1] if context.endswith(".") else context
        context += " " + connector[row["question"]]
        for choice in (row["choice1"], row["choice2"]):
            continuation = " " + choice[0].lower() + choice[1:]
            ctx = call(conn, "/tokenize", {"prompt": context})["tokens"]
            cont = call(conn, "/tokenize", {"prompt": continuation})["tokens"]
            out.append(ctx + cont)
    return out


def run_clients(port, prompts, clients, extension):
    latencies = []
    lock = threading.Lock()
    next_index = [0]

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port)
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(prompts):
                return
            body = {"prompt": [prompts[i]], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
            if extension:
                body["kvevict"] = extension
            t0 = time.perf_counter()
            call(conn, "/v1/completions", body)
            with lock:
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--docs", type=int, default=100)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch-sizes", default="1", help="the server's --batch-size, each with each worker count")
    ap.add_argument("--clients", type=int, default=0, help="concurrent clients (default: the worker count)")
    ap.add_argument("--repeat", type=int, default=3, help="passes over the requests; the best is reported")
    args, policy = ap.parse_known_args()
    load = os.getloadavg()[0]
    proc, port = start(args.binary, policy)
    prompts = copa_requests(port, args.docs)
    proc.terminate()
    proc.wait()
    mean_tokens = sum(len(p) for p in prompts) / len(prompts)
    print(f"{len(prompts)} COPA requests ({args.docs} documents, {mean_tokens:.1f} tokens each), "
          f"policy flags: {' '.join(policy) or 'full'}; load average {load:.2f}")
    one_client_latency = None
    configurations = [(int(b), int(w)) for b in args.batch_sizes.split(",") for w in args.workers.split(",")]
    for batch, workers in configurations:
        clients = args.clients or workers
        proc, port = start(args.binary, policy + ["--workers", str(workers), "--batch-size", str(batch)])
        run_clients(port, prompts[:10], clients, None)  # warm up
        best = None
        for _ in range(args.repeat):
            seconds, latencies = run_clients(port, prompts, clients, None)
            if best is None or seconds < best[0]:
                best = (seconds, latencies)
        proc.terminate()
        proc.wait()
        seconds, latencies = best
        latencies.sort()
        print(f"batch size {batch}, workers {workers}, clients {clients}: {len(prompts) / seconds:.1f} requests/s, "
              f"latency mean {1000 * sum(latencies) / len(latencies):.2f} ms, "
              f"p50 {1000 * latencies[len(latencies) // 2]:.2f} ms")
        if workers == 1 and clients == 1 and batch == 1:
            one_client_latency = sum(latencies) / len(latencies)
    # eval on the same documents, one thread, best of repeat: its own timer ("seconds").
    eval_seconds = None
    for _ in range(args.repeat):
        out = subprocess.run([args.binary, "eval", "--task", "copa", "--limit", str(args.docs), "--file-order",
                              "--threads", "1"] + policy, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("kvevict eval failed: " + out.stderr)
        s = json.loads(out.stdout)["seconds"]
        eval_seconds = s if eval_seconds is None else min(eval_seconds, s)
    per_request = eval_seconds / len(prompts)
    print(f"eval: {1000 * per_request:.2f} ms per request ({eval_seconds:.3f} s for {len(prompts)})" +
          ("" if one_client_latency is None else
           f"; HTTP adds {1000 * (one_client_latency - per_request):.2f} ms per request "
           f"(server latency with one client {1000 * one_client_latency:.2f} ms)"))


if __name__ == "__main__":
    main()
