"""Workloads: what prompts to send. Pure and seeded, so a run is reproducible.

- shared-prefix: many tenants share long system prompts (default 32 prompts x ~2k tokens) chosen with
  Zipf popularity; each request adds a short user question. The prefix-cache workload.
- multi-turn: sessions of several turns; each turn resends the whole conversation so far.
- random: unrelated prompts of random length (a cache-hostile baseline).

Token counts are approximate: prompts are built from words and the built-in simulator tokenizer maps
one word (with its leading space) to one token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

WORKLOADS = ("shared-prefix", "multi-turn", "random")

_WORD_TEXT = (
    "account billing cluster deploy engine fabric gateway health inference journal kernel latency memory "
    "network operator policy queue replica storage tenant upgrade volume worker region shard budget "
    "capacity driver error firmware graph index job lease metric node owner patch quota release secret "
    "token usage vendor window zone answer please explain summarize compare list"
)
_WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class BenchRequest:
    index: int
    tenant: str
    #: the prompt text (the conversation so far for multi-turn, rendered as plain text)
    text: str
    max_new_tokens: int
    session: int | None = None
    turn: int = 0
    #: chat messages for /v1/chat/completions
    messages: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str = "shared-prefix"
    requests: int = 200
    seed: int = 0
    max_new_tokens: int = 128
    num_prefixes: int = 32
    prefix_tokens: int = 2048
    question_tokens: int = 32
    zipf_s: float = 1.1
    turns: int = 4
    random_min_tokens: int = 64
    random_max_tokens: int = 2048


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k**s) for k in range(1, n + 1)]


def build(spec: WorkloadSpec) -> list[BenchRequest]:
    if spec.name not in WORKLOADS:
        raise ValueError(f"unknown workload {spec.name!r}; known: {', '.join(WORKLOADS)}")
    if spec.requests < 1:
        raise ValueError("requests must be at least 1")
    rng = random.Random(spec.seed)
    if spec.name == "shared-prefix":
        return _shared_prefix(spec, rng)
    if spec.name == "multi-turn":
        return _multi_turn(spec, rng)
    return _random(spec, rng)


def _shared_prefix(spec: WorkloadSpec, rng: random.Random) -> list[BenchRequest]:
    prefixes = [
        f"You are assistant {i} of tenant-{i:02d}. Policy: " + _words(rng, spec.prefix_tokens)
        for i in range(spec.num_prefixes)
    ]
    weights = zipf_weights(spec.num_prefixes, spec.zipf_s)
    out = []
    for i in range(spec.requests):
        t = rng.choices(range(spec.num_prefixes), weights)[0]
        question = f"Question {i}: " + _words(rng, spec.question_tokens)
        out.append(
            BenchRequest(
                index=i,
                tenant=f"tenant-{t:02d}",
                text=prefixes[t] + "\n\n" + question,
                max_new_tokens=spec.max_new_tokens,
                messages=[{"role": "system", "content": prefixes[t]}, {"role": "user", "content": question}],
            )
        )
    return out


def _multi_turn(spec: WorkloadSpec, rng: random.Random) -> list[BenchRequest]:
    """Requests of one session must run in order (the runner keeps turns of a session sequential)."""
    out: list[BenchRequest] = []
    sessions = max(1, spec.requests // spec.turns)
    for s in range(sessions):
        history = f"Session {s}. System: be helpful. " + _words(rng, spec.question_tokens * 4)
        messages = [{"role": "system", "content": history}]
        for turn in range(spec.turns):
            if len(out) >= spec.requests:
                break
            user = _words(rng, spec.question_tokens)
            messages = [*messages, {"role": "user", "content": user}]
            history = f"{history}\nUser: {user}"
            out.append(
                BenchRequest(
                    index=len(out),
                    tenant=f"session-{s}",
                    text=history,
                    max_new_tokens=spec.max_new_tokens,
                    session=s,
                    turn=turn,
                    messages=list(messages),
                )
            )
            # the assistant's answer is not known in advance; a fixed stand-in keeps prompts reproducible
            answer = _words(rng, spec.question_tokens)
            history = f"{history}\nAssistant: {answer}"
            messages = [*messages, {"role": "assistant", "content": answer}]
    return out


def _random(spec: WorkloadSpec, rng: random.Random) -> list[BenchRequest]:
    out = []
    for i in range(spec.requests):
        n = rng.randint(spec.random_min_tokens, spec.random_max_tokens)
        text = f"Request {i} {rng.random()}: " + _words(rng, n)
        out.append(BenchRequest(i, "random", text, spec.max_new_tokens, messages=[{"role": "user", "content": text}]))
    return out
