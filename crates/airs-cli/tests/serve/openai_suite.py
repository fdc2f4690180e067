"""The server driven by the official `openai` Python client (and raw HTTP where the client
cannot go): one scenario per subcommand, run by crates/airs-cli/tests/serve.rs against a real
`airs serve`. A failed check raises; the exit status says whether every check held."""

import argparse
import concurrent.futures as cf
import http.client
import json
import math
import pathlib
import random
import socket
import sys
import time
import urllib.parse

import openai

# The repository root (this file is crates/airs-cli/tests/serve/openai_suite.py).
REPO = pathlib.Path(__file__).resolve().parents[4]


def client(args, key=None):
    return openai.OpenAI(
        base_url=args.base + "/v1",
        api_key=key if key is not None else (args.key or "none"),
        max_retries=0,
        timeout=300,
    )


def raw(args, method, path, body=None, key=None, headers=None):
    """One HTTP request without the client: (status, headers, body bytes)."""
    u = urllib.parse.urlparse(args.base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    h = {"Content-Type": "application/json"}
    k = key if key is not None else args.key
    if k:
        h["Authorization"] = "Bearer " + k
    h.update(headers or {})
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    out = (r.status, dict(r.getheaders()), r.read())
    conn.close()
    return out


def pool(args):
    status, _, body = raw(args, "GET", "/v1/pool")
    assert status == 200, (status, body)
    return json.loads(body)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what if len(what) < 120 else what[:117] + "...")


def chat(c, args, messages, **kw):
    kw.setdefault("temperature", 0)
    return c.chat.completions.create(model=args.model, messages=messages, **kw)


def api(args):
    c = client(args)
    ids = [m.id for m in c.models.list().data]
    check(args.model in ids, f"/v1/models lists {args.model}: {ids}")
    listed = json.loads(raw(args, "GET", "/v1/models")[2])["data"][0]
    check(listed["memory"]["region_bytes"] > 0 and "locked_bytes" in listed["memory"],
          f"/v1/models reports the model's memory: {listed['memory']}")

    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello to the world."}]
    r = chat(c, args, msgs, max_tokens=16)
    choice = r.choices[0]
    check(choice.message.role == "assistant" and choice.message.content, "chat answers")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
    u = r.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 16
          and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
    check(u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens is not None,
          "usage carries prompt_tokens_details.cached_tokens")

    chunks = list(chat(c, args, msgs, max_tokens=16, stream=True,
                       stream_options={"include_usage": True}))
    check(len({ch.id for ch in chunks}) == 1, "one id on every chunk")
    check(chunks[0].choices[0].delta.role == "assistant", "the role comes in the first delta")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(text == choice.message.content, f"the stream says what the plain answer said: {text!r}")
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(finishes == [choice.finish_reason], f"one finish_reason: {finishes}")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens,
          "usage in a last chunk")

    # Content as an array of text parts.
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say hello "},
                                          {"type": "text", "text": "to the world."}]}]
    r2 = chat(c, args, [msgs[0]] + parts, max_tokens=16)
    check(r2.choices[0].message.content == choice.message.content, "text parts join")

    cr = c.completions.create(model=args.model, prompt="def fibonacci(n):", max_tokens=12,
                              temperature=0)
    check(cr.choices[0].text and cr.usage.completion_tokens > 0, f"completion {cr.choices[0].text!r}")
    tok = json.loads(raw(args, "POST", "/tokenize", {"content": "def fibonacci(n):"})[2])["tokens"]
    cr2 = c.completions.create(model=args.model, prompt=tok, max_tokens=12, temperature=0)
    check(cr2.choices[0].text == cr.choices[0].text, "a prompt of token ids completes the same")
    detok = json.loads(raw(args, "POST", "/detokenize", {"tokens": tok})[2])["content"]
    check(detok == "def fibonacci(n):", f"detokenize round-trips: {detok!r}")

    e = c.embeddings.create(model=args.model, input=["hello world", "a cat sat on the mat"])
    check(len(e.data) == 2 and e.data[0].index == 0 and e.usage.prompt_tokens > 0, "two embeddings")
    v = e.data[0].embedding
    check(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 and v != e.data[1].embedding,
          f"embeddings are L2-normalized ({len(v)} values) and differ")
    ef = c.embeddings.create(model=args.model, input="hello world", encoding_format="float")
    check(max(abs(a - b) for a, b in zip(ef.data[0].embedding, v)) < 1e-6,
          "float and base64 encodings agree")

    rn = chat(c, args, msgs, max_tokens=12, n=2, temperature=0.9, seed=3)
    check(len(rn.choices) == 2 and {ch.index for ch in rn.choices} == {0, 1}, "n = 2 gives two choices")
    rg = chat(c, args, msgs, max_tokens=12, n=2)
    check(rg.choices[0].message.content == rg.choices[1].message.content, "greedy choices agree")

    rl = chat(c, args, msgs, max_tokens=8, logprobs=True, top_logprobs=3)
    lp = rl.choices[0].logprobs.content
    check(len(lp) == rl.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in lp),
          "logprobs: one entry per token with 3 alternatives")
    check(all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.logprob - 1e-5 for t in lp),
          "the chosen token is no likelier than the most likely (greedy: equal)")
    cl = c.completions.create(model=args.model, prompt="def fibonacci(n):", max_tokens=5,
                              temperature=0, logprobs=2)
    check(len(cl.choices[0].logprobs.token_logprobs) == cl.usage.completion_tokens,
          "completion logprobs")

    # logit_bias: +100 makes a token the only choice, -100 bans the one greedy picks.
    hello = json.loads(raw(args, "POST", "/tokenize", {"content": "Hello"})[2])["tokens"]
    check(len(hello) == 1, f"'Hello' is one token: {hello}")
    rb = chat(c, args, msgs, max_tokens=3, logit_bias={str(hello[0]): 100})
    check(rb.choices[0].message.content.startswith("HelloHello"),
          f"logit_bias +100 forces a token: {rb.choices[0].message.content!r}")
    first = json.loads(raw(args, "POST", "/tokenize", {"content": choice.message.content})[2])["tokens"][0]
    rban = chat(c, args, msgs, max_tokens=16, logit_bias={str(first): -100})
    again = json.loads(raw(args, "POST", "/tokenize", {"content": rban.choices[0].message.content})[2])["tokens"]
    check(rban.choices[0].message.content != choice.message.content and again[0] != first,
          f"logit_bias -100 bans the greedy first token: {rban.choices[0].message.content!r}")

    # response_format json_object: one JSON object, also where the model would not write one.
    haiku = [{"role": "user", "content": "Write a haiku about rain."}]
    rj = chat(c, args, haiku, max_tokens=160, response_format={"type": "json_object"})
    obj = json.loads(rj.choices[0].message.content)
    check(isinstance(obj, dict) and obj and rj.choices[0].finish_reason == "stop",
          f"response_format json_object gives one object: {rj.choices[0].message.content!r}")
    free = chat(c, args, haiku, max_tokens=160).choices[0].message.content
    check(not free.lstrip().startswith("{"), f"unasked, the reply is no JSON: {free!r}")
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chat(
        c, args, haiku, max_tokens=160, response_format={"type": "json_object"}, stream=True)
        if ch.choices)
    check(streamed == rj.choices[0].message.content, "the JSON streams as it answers")
    cj = c.completions.create(model=args.model, prompt="A JSON object describing a dog:",
                              max_tokens=120, temperature=0,
                              extra_body={"response_format": {"type": "json_object"}})
    check(isinstance(json.loads(cj.choices[0].text), dict) and cj.choices[0].finish_reason == "stop",
          f"a completion takes response_format too: {cj.choices[0].text!r}")
    # json_schema, as the client's structured outputs send it (a strict schema from a pydantic
    # model) and parse the reply back into the model.
    from typing import Literal
    from pydantic import BaseModel

    class Cat(BaseModel):
        name: str
        age: int
        food: Literal["fish", "meat", "milk"]
        indoor: bool

    for ask in ["Describe a fictional cat.", "Write a haiku about rain."]:
        rp = c.chat.completions.parse(model=args.model, messages=[{"role": "user", "content": ask}],
                                      response_format=Cat, max_tokens=200, temperature=0)
        cat = rp.choices[0].message.parsed
        check(isinstance(cat, Cat) and rp.choices[0].finish_reason == "stop",
              f"json_schema: {ask!r} is answered with a Cat: {cat!r}")
    tools_api(c, args, haiku)
    redraws = [l for l in raw(args, "GET", "/metrics")[2].decode().splitlines()
               if l.startswith("airs_constrained_redraws_total")]
    check(redraws and float(redraws[0].split()[-1]) > 0,
          f"/metrics counts the constrained redraws: {redraws}")
    # Speculative decoding (on by default): a reply that copies its prompt keeps drafts, and is
    # the same text streamed or not.
    code = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    copy = [{"role": "user", "content": f"Repeat this code exactly:\n```python\n{code}```"}]
    whole = chat(c, args, copy, max_tokens=60).choices[0].message.content
    streamed = "".join(ch.choices[0].delta.content or ""
                       for ch in chat(c, args, copy, max_tokens=60, stream=True) if ch.choices)
    check(code.strip() in whole and streamed == whole,
          f"a reply with drafts copies the code, streamed or not: {whole!r} {streamed!r}")
    metrics = raw(args, "GET", "/metrics")[2].decode().splitlines()
    kept = [l for l in metrics if l.startswith("airs_draft_accepted_tokens_total")]
    check(kept and float(kept[0].split()[-1]) > 0, f"/metrics counts the drafts kept: {kept}")
    # The step cost drafts are weighed by, measured by now: a positive time a step.
    fixed = [float(l.split()[-1]) for l in metrics if l.startswith("airs_step_fixed_seconds{")]
    row = [float(l.split()[-1]) for l in metrics if l.startswith("airs_step_row_seconds{")]
    check(fixed and row and fixed[0] >= 0 and row[0] >= 0 and fixed[0] + row[0] > 0,
          f"/metrics shows the measured step cost: {fixed} {row}")
    try:
        chat(c, args, haiku, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}}}}})
        check(False, "a schema with a keyword airs does not enforce is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "pattern" in str(e),
              f"a schema airs cannot enforce gets 400 naming the keyword: {e.body}")

    rs = chat(c, args, msgs, max_tokens=40, stop=["\n", "."])
    check("\n" not in rs.choices[0].message.content and "." not in rs.choices[0].message.content,
          "stop strings end the text and are not part of it")

    try:
        client(args, key="wrong").models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and "API key" in str(e), "a wrong key gets 401")
    try:
        c.chat.completions.create(model="no-such-model", messages=msgs)
        check(False, "an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "an unknown model gets 404")
    try:
        chat(c, args, [{"role": "user", "content": "lorem ipsum dolor " * args.context}], max_tokens=4)
        check(False, "an oversized prompt is refused")
    except openai.BadRequestError as e:
        body = e.body or {}
        msg = str(body.get("message", e))
        check(e.status_code == 400 and "positions" in msg and str(args.context) in msg
              and body.get("code") == "context_length_exceeded",
              f"an oversized prompt gets 400 with the numbers: {msg}")
    big = json.dumps({"model": args.model, "messages": [{"role": "user", "content": "a" * (5 << 20)}]})
    status, headers, body = raw(args, "POST", "/v1/chat/completions", big.encode())
    check(status == 413 and json.loads(body)["error"]["type"] == "invalid_request_error",
          "an oversized body gets 413 in OpenAI's shape")
    for bad in [b"{", b"[]", b'{"messages": "hi"}', b'{"messages": []}',
                b'{"messages": [{"role": "tool", "content": "x"}]}',
                b'{"messages": [{"role": "user", "content": "x"}], "temperature": -3}',
                b'{"messages": [{"role": "user", "content": "x"}], "n": 99}']:
        status, _, body = raw(args, "POST", "/v1/chat/completions", bad)
        err = json.loads(body)["error"]
        check(status == 400 and err["message"] and err["type"] == "invalid_request_error",
              f"malformed {bad[:40]!r} gets 400: {err['message'][:60]}")
    status, _, _ = raw(args, "GET", "/health", key="")
    check(status == 200, "/health needs no key")
    status, _, body = raw(args, "GET", "/metrics")
    text = body.decode()
    for name in ["airs_requests_running", "airs_requests_waiting", "airs_prompt_tokens_total",
                 "airs_generation_tokens_total", "airs_time_to_first_token_seconds_bucket",
                 "airs_inter_token_latency_seconds_bucket", "airs_kv_blocks_used",
                 "airs_kv_blocks_total", "airs_prefix_cache_queried_tokens_total",
                 "airs_prefix_cache_hit_tokens_total", "airs_preemptions_total",
                 "airs_evictions_total", "airs_rebuilt_tokens_total", "airs_model_pool_bytes",
                 "airs_weights_resident_bytes"]:
        check(name in text, f"/metrics has {name}")


PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is the capital of Japan?",
    "List three colors.",
    "Explain recursion in one sentence.",
    "Write a haiku about rain.",
    "What does HTTP stand for?",
    "Name a prime number larger than 10.",
    "Translate 'good morning' to French.",
]
PRIORITIES = ["interactive", "system", "background"]


def tools_api(c, args, haiku):
    """Function calling: Qwen's template shows the tools, the reply's calls come back as
    tool_calls (plain, streamed, through the client's helpers), a forced call is a call of the
    schema, and results go back as tool messages."""
    from pydantic import BaseModel

    weather, add = json.loads((REPO / "testdata/tools/weather-and-add.json").read_text())
    ask = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    rt = chat(c, args, ask, max_tokens=96, tools=[weather, add])
    m = rt.choices[0].message
    check(rt.choices[0].finish_reason == "tool_calls" and m.content is None
          and len(m.tool_calls) == 1 and m.tool_calls[0].type == "function"
          and m.tool_calls[0].id.startswith("call_")
          and m.tool_calls[0].function.name == "get_weather"
          and json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris"},
          f"a weather question is answered with a call: {m}")
    calls, finish = {}, None
    for ch in chat(c, args, ask, max_tokens=96, tools=[weather, add], stream=True):
        if not ch.choices:
            continue
        for tc in ch.choices[0].delta.tool_calls or []:
            e = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            e["name"] += tc.function.name or ""
            e["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    check(finish == "tool_calls" and calls == {0: {
        "name": "get_weather", "arguments": m.tool_calls[0].function.arguments}},
        f"streamed, the call arrives as tool_calls deltas: {calls} {finish}")

    class GetWeather(BaseModel):
        city: str

    strict = openai.pydantic_function_tool(GetWeather, name="get_weather")
    with c.chat.completions.stream(model=args.model, messages=ask, tools=[strict],
                                   max_tokens=96, temperature=0) as st:
        final = st.get_final_completion()
    parsed = final.choices[0].message.tool_calls[0].function.parsed_arguments
    check(isinstance(parsed, GetWeather) and parsed.city == "Paris",
          f"the client's stream helper parses the arguments of a strict tool: {parsed!r}")
    rp = c.chat.completions.parse(model=args.model, messages=ask, tools=[strict],
                                  max_tokens=96, temperature=0)
    parsed = rp.choices[0].message.tool_calls[0].function.parsed_arguments
    check(isinstance(parsed, GetWeather) and parsed.city == "Paris",
          f"chat.completions.parse too: {parsed!r}")

    # A question no tool answers gets text; forced, the same question gets a call of the schema.
    rh = chat(c, args, haiku, max_tokens=96, tools=[weather, add])
    check(rh.choices[0].message.tool_calls is None and rh.choices[0].message.content
          and rh.choices[0].finish_reason == "stop", f"a haiku is text: {rh.choices[0].message}")
    rf = chat(c, args, haiku, max_tokens=96, tools=[add, weather],
              tool_choice={"type": "function", "function": {"name": "add"}})
    call = rf.choices[0].message.tool_calls[0]
    args_ = json.loads(call.function.arguments)
    check(rf.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
          and isinstance(args_.get("a"), int) and isinstance(args_.get("b"), int),
          f"tool_choice add: a call of add's schema, asked for a haiku: {call}")
    rf = chat(c, args, haiku, max_tokens=96, tools=[add, weather], tool_choice="required")
    call = rf.choices[0].message.tool_calls[0]
    a = json.loads(call.function.arguments)
    check(rf.choices[0].finish_reason == "tool_calls" and (
        (call.function.name == "get_weather" and list(a) == ["city"] and isinstance(a["city"], str))
        or (call.function.name == "add" and sorted(a) == ["a", "b"]
            and all(isinstance(v, int) for v in a.values()))),
        f"tool_choice required: a call of one tool, of that tool's schema, for a haiku: {call}")
    rn = chat(c, args, ask, max_tokens=96, tools=[weather, add], tool_choice="none")
    check(rn.choices[0].message.tool_calls is None and rn.choices[0].message.content,
          f"tool_choice none: text: {rn.choices[0].message.content!r}")

    # The result goes back as a tool message, after the assistant's call.
    follow = ask + [m.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": m.tool_calls[0].id,
                     "content": '{"temperature_c": 22, "sky": "sunny"}'}]
    rr = chat(c, args, follow, max_tokens=64, tools=[weather, add])
    check(rr.usage.prompt_tokens > rt.usage.prompt_tokens + 30
          and rr.choices[0].finish_reason in ("stop", "tool_calls", "length"),
          f"a tool result is rendered into the prompt ({rt.usage.prompt_tokens} -> "
          f"{rr.usage.prompt_tokens} tokens): {rr.choices[0].message}")

    # With a session the client sends only the new messages: the question, then the result
    # of the call the server's copy of the conversation ends with.
    sess = {"session": f"tools-{random.getrandbits(32)}"}
    s1 = chat(c, args, ask, max_tokens=96, tools=[weather, add], extra_body=sess)
    sc = s1.choices[0].message
    check(s1.choices[0].finish_reason == "tool_calls" and sc.tool_calls
          and sc.tool_calls[0].function.name == "get_weather",
          f"a session's question is answered with a call: {sc}")
    result = [{"role": "tool", "tool_call_id": sc.tool_calls[0].id,
               "content": '{"temperature_c": 22, "sky": "sunny"}'}]
    s2 = chat(c, args, result, max_tokens=64, tools=[weather, add], extra_body=sess)
    check(0 < s2.usage.prompt_tokens < 40
          and s2.choices[0].finish_reason in ("stop", "tool_calls", "length"),
          f"then only the result is sent, and only it is new to the prompt "
          f"({s2.usage.prompt_tokens} tokens): {s2.choices[0].message}")
    try:
        chat(c, args, [{"role": "user", "content": "x"}], max_tokens=8, tools=[add],
             extra_body=sess)
        check(False, "a session's tools cannot change")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "first turn" in str(e), f"other tools get 400: {e.body}")

    for kw, what in [
        (dict(tool_choice="required"), "tool_choice required without tools"),
        (dict(tools=[weather], tool_choice={"type": "function", "function": {"name": "x"}}),
         "tool_choice naming no tool"),
        (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "a bad tool name"),
        (dict(functions=[{"name": "f", "parameters": {}}]), "the deprecated functions"),
    ]:
        try:
            chat(c, args, haiku, max_tokens=8, **kw)
            check(False, f"{what} is refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"{what} gets 400: {e.body}")


def concurrency(args):
    c = client(args)

    def ask(i):
        r = chat(c, args, [{"role": "user", "content": PROMPTS[i]}], max_tokens=args.max_tokens,
                 extra_body={"priority": PRIORITIES[i % 3]})
        return r.choices[0].message.content

    alone = [ask(i) for i in range(8)]
    with cf.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(ask, range(8)))
    for i in range(8):
        check(together[i] == alone[i], f"client {i} ({PRIORITIES[i % 3]}) at once = alone: {together[i][:40]!r}")
    m = raw(args, "GET", "/metrics")[2].decode()
    check("airs_requests_running" in m, "metrics after the run")


def prefix(args):
    c = client(args)
    system = ("You are the assistant of a small home computer. " +
              "Answer in one short sentence, never make things up, and say when you do not know. " * 12)
    first = chat(c, args, [{"role": "system", "content": system},
                           {"role": "user", "content": "What is 2 + 2?"}], max_tokens=4)
    second = chat(c, args, [{"role": "system", "content": system},
                            {"role": "user", "content": "What is the capital of Italy?"}], max_tokens=4)
    cached = second.usage.prompt_tokens_details.cached_tokens
    check(cached > 0 and cached < second.usage.prompt_tokens,
          f"a second request sharing a long system prompt reports cached_tokens {cached} of "
          f"{second.usage.prompt_tokens} (the first: {first.usage.prompt_tokens_details.cached_tokens})")


def kv_once_freed(args, seconds=10):
    """The first model's KV map once it holds no block (or when `seconds` have passed)."""
    deadline = time.time() + seconds
    while True:
        kv = pool(args)["models"][0]["kv"]
        if (kv["blocks_used"] == 0 and not kv["holders"]) or time.time() > deadline:
            return kv
        time.sleep(0.1)


def disconnect(args):
    u = urllib.parse.urlparse(args.base)
    body = json.dumps({"model": args.model, "stream": True, "max_tokens": 1500, "temperature": 0.8,
                       "messages": [{"role": "user", "content": "Tell me a very long story."}]})
    hdrs = f"Authorization: Bearer {args.key}\r\n" if args.key else ""

    def stream(events):
        """A raw streaming request on its own socket, read until `events` data lines came."""
        s = socket.create_connection((u.hostname, u.port))
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"{hdrs}Content-Length: {len(body)}\r\n\r\n{body}").encode())
        got = b""
        while got.count(b"data:") < events:
            got += s.recv(4096)
        return s

    s = stream(6)
    held = pool(args)["models"][0]["kv"]
    check(held["blocks_used"] > 0 and any(h["running"] for h in held["holders"]),
          f"the stream holds blocks ({held['blocks_used']})")
    s.close()
    kv = kv_once_freed(args)
    check(kv["blocks_used"] == 0 and not kv["holders"], f"disconnecting freed every block: {kv['blocks_used']} used")
    m = raw(args, "GET", "/metrics")[2].decode()
    check('airs_requests_cancelled_total{model="' + args.model + '"} 1' in m, "the request was cancelled")
    # Clients that close with the stream unread (the kernel answers the server's next segment
    # with RST) at every point of a stream, some while another request is served. The server's
    # read sees the reset and a later write fails with EPIPE; the server must not die of SIGPIPE
    # (it did, one time in tens), and every other client must still be served.
    rng = random.Random(11)
    resets = 200
    for i in range(resets):
        s = stream(rng.randint(0, 8))
        if rng.random() < 0.5:
            pool(args)
        s.close()
        status, _, _ = raw(args, "GET", "/health")
        assert status == 200, f"after reset {i}: /health {status}"
    kv = kv_once_freed(args)
    check(kv["blocks_used"] == 0 and not kv["holders"],
          f"the server outlived {resets} clients that reset mid-stream, and freed their blocks")


def load(args):
    c = client(args)
    statuses = {}
    rng = random.Random(7)
    plan = [[(rng.choice(PROMPTS), rng.randint(1, 48), rng.random() < 0.4, rng.choice(PRIORITIES))
             for _ in range(args.requests)] for _ in range(args.clients)]

    def worker(k):
        seen = []
        for prompt, max_tokens, stream, priority in plan[k]:
            # Retried on 429/503 (after a short pause: the test does not wait the full
            # Retry-After), until served.
            for attempt in range(400):
                try:
                    if stream:
                        n = sum(1 for _ in chat(c, args, [{"role": "user", "content": prompt}],
                                                max_tokens=max_tokens, stream=True,
                                                extra_body={"priority": priority}))
                        assert n > 0
                    else:
                        r = chat(c, args, [{"role": "user", "content": prompt}],
                                 max_tokens=max_tokens, extra_body={"priority": priority})
                        assert r.usage.completion_tokens >= 1
                    seen.append(200)
                    break
                except openai.APIStatusError as e:
                    seen.append(e.status_code)
                    if e.status_code not in (429, 503):
                        break
                    assert e.response.headers.get("retry-after"), "429/503 carry Retry-After"
                    time.sleep(0.02 + 0.01 * rng.random())
        return seen

    started = time.time()
    with cf.ThreadPoolExecutor(args.clients) as ex:
        for seen in ex.map(worker, range(args.clients)):
            for s in seen:
                statuses[s] = statuses.get(s, 0) + 1
    took = time.time() - started
    print("statuses", statuses, f"in {took:.1f} s")
    check(set(statuses) <= {200, 429, 503}, f"no status but 200, 429 and 503: {statuses}")
    check(statuses.get(200, 0) == args.clients * args.requests, "every request was served in the end")
    deadline = time.time() + 10
    while time.time() < deadline:
        p = pool(args)["models"][0]
        if p["running"] == 0 and p["waiting"] == 0 and p["kv"]["blocks_used"] == 0:
            break
        time.sleep(0.1)
    check(p["running"] == 0 and p["waiting"] == 0 and p["kv"]["blocks_used"] == 0,
          f"memory returns to idle: {p['running']} running, {p['kv']['blocks_used']} blocks used")
    check(raw(args, "GET", "/health")[0] == 200, "healthy after the load")


def session(args):
    """Sends --turns of --session one at a time, printing ACK <i> <json> after each answer; with
    --stream-last, streams the last turn and prints CHUNK lines as they arrive."""
    c = client(args)
    turns = args.turns.split("|")
    for i, t in enumerate(turns):
        msgs = [{"role": "user", "content": t}]
        if i == 0 and args.system:
            msgs = [{"role": "system", "content": args.system}] + msgs
        extra = {"session": args.session}
        if args.stream_last and i == len(turns) - 1:
            for ch in chat(c, args, msgs, max_tokens=args.max_tokens, stream=True, extra_body=extra):
                if ch.choices:
                    print("CHUNK", json.dumps(ch.choices[0].delta.content), flush=True)
            print("STREAM-DONE", flush=True)
        else:
            r = chat(c, args, msgs, max_tokens=args.max_tokens, extra_body=extra)
            print("ACK", i, json.dumps({"text": r.choices[0].message.content}), flush=True)


def remote(args):
    c = client(args)
    data = json.loads(raw(args, "GET", "/v1/models")[2])["data"]
    check(data and all(m.get("remote") for m in data), f"models are listed as remote: {data}")
    direct = openai.OpenAI(base_url=args.remote_base + "/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "Once upon a time"}]
    want = chat(direct, args, msgs, max_tokens=12).choices[0].message.content
    got = chat(c, args, msgs, max_tokens=12).choices[0].message.content
    check(got == want, f"through the remote route: {got!r}")
    text = "".join(ch.choices[0].delta.content or "" for ch in
                   chat(c, args, msgs, max_tokens=12, stream=True) if ch.choices)
    check(text == want, "streaming passes through")
    e = c.embeddings.create(model=args.model, input="hello")
    check(len(e.data[0].embedding) > 0, "embeddings pass through")
    try:
        c.chat.completions.create(model=args.model, messages=msgs, temperature=-1)
        check(False, "remote errors pass through")
    except openai.BadRequestError as e:
        check(e.status_code == 400, "the remote's 400 passes through")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("--base", required=True)
    p.add_argument("--key")
    p.add_argument("--model", required=True)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=25)
    p.add_argument("--session")
    p.add_argument("--system")
    p.add_argument("--turns", default="")
    p.add_argument("--stream-last", action="store_true")
    p.add_argument("--remote-base")
    args = p.parse_args()
    {"api": api, "concurrency": concurrency, "prefix": prefix, "disconnect": disconnect,
     "load": load, "session": session, "remote": remote}[args.scenario](args)
    print("PASS", args.scenario)


if __name__ == "__main__":
    main()
