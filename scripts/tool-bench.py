#!/usr/bin/env python3
"""Function calling through a running `airs serve` (or any OpenAI-compatible server): the time
from request to full reply for one question with no tools, with two tools (`auto`) and with a
call forced (`required`), alternated for ROUNDS rounds, one request at a time, each with a
system message of its own so that no prompt prefix is cached; and `auto` again with one fixed
system message, whose prefix (system message and tools) the server may have cached from the
round before. Prints medians, cached prompt tokens and every run.

    airs serve --model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --port 8181 --loader eager &
    python3 scripts/tool-bench.py [http://localhost:8181] [ROUNDS=7]
"""
import json
import pathlib
import statistics
import sys
import time
import urllib.request

base = sys.argv[1] if len(sys.argv) > 1 else "http://localhost:8181"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7


def post(body):
    start = time.perf_counter()
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(req))
    return time.perf_counter() - start, reply


tools_file = pathlib.Path(__file__).resolve().parents[1] / "testdata/tools/weather-and-add.json"
weather, add = json.loads(tools_file.read_text())
ask = [{"role": "user", "content": "What's the weather like in Paris today?"}]
cases = [("no tools", {}), ("tools, auto", {"tools": [weather, add]}),
         ("tools, required", {"tools": [weather, add], "tool_choice": "required"}),
         ("tools, auto, cached", {"tools": [weather, add], "fixed_system": True})]
runs = {name: [] for name, _ in cases}
for r in range(rounds):
    for name, extra in cases:
        extra = dict(extra)
        if extra.pop("fixed_system", False):
            system = {"role": "system", "content": "You are a helpful assistant."}
        else:
            system = {"role": "system",
                      "content": f"Run {r} at {time.time()}. You are a helpful assistant."}
        body = dict(extra, messages=[system] + ask, temperature=0, max_tokens=64)
        seconds, reply = post(body)
        choice = reply["choices"][0]
        usage = reply["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        runs[name].append((seconds, usage["prompt_tokens"], cached,
                           usage["completion_tokens"], choice["finish_reason"]))
for name, rs in runs.items():
    ms = [round(x[0] * 1000, 1) for x in rs]
    _, prompt, cached, completion, finish = rs[-1]
    print(f"{name:20} median {statistics.median(ms):7.1f} ms  prompt {prompt} (cached {cached}) "
          f"completion {completion} finish {finish}  runs {ms}")
