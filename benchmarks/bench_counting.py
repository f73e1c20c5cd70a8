"""Token counting: agent_flow's compact counter beside tiktoken's encoder, speed and memory.

`TiktokenCounter` counts with `agent_flow._bpe.BytePairCounter` (the encoding's ranks in
about 2 MB) instead of tiktoken's Rust encoder (about 22 MB for ``cl100k_base``). Both give
the same counts (tests/test_bpe.py); this prints what each costs, in the same run:

- memory: the resident memory a fresh process gains building each (RssAnon, /proc), and
  the time to build it;
- speed, per corpus, in microseconds per 1,000 characters: tiktoken's
  ``len(encode_ordinary(text))``; ours "cold" (the first count of the corpus by a fresh
  counter: every piece new) and "warm" (counted again: the pieces are remembered, as in a
  session, where most of a new text is words seen before). The corpora are this repository's
  README (prose), agent_flow's own source (code), a JSON tool result, the same rows as one
  line of JSON ending in "…", a text in German, Japanese and Russian, and a base64 blob (long
  runs of letters, the worst case for merging).

Usage: python benchmarks/bench_counting.py [--encoding cl100k_base] [--rounds 5]
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = {"cl100k_base": "gpt-4", "o200k_base": "gpt-4o"}


def corpora() -> dict[str, str]:
    rng = random.Random(7)
    source = "\n".join(p.read_text() for p in sorted((ROOT / "agent_flow").rglob("*.py"))[:40])
    rows = [
        {"id": i, "path": f"/srv/data/{rng.randrange(10**6):06d}.csv", "size": rng.random()}
        for i in range(400)
    ]
    languages = (
        "Die Verträge wurden gestern unterschrieben, und die Übergabe folgt nächste Woche. "
        "東京の天気は明日から崩れる見込みです。会議は午後三時に始まります。 "
        "Сегодня мы обсудили новый план, и все согласились с предложениями. "  # noqa: RUF001
    ) * 20
    return {
        "README (prose)": (ROOT / "README.md").read_text()[:60_000],
        "agent_flow source (code)": source[:60_000],
        "JSON tool result": json.dumps(rows, indent=1),
        # One line, one character outside ASCII: as a long string the environment shortened
        # renders ("… [+N chars]"), or a compact JSON document with one "é" in it.
        "a JSON line with one …": json.dumps(rows, ensure_ascii=False) + "…",
        "German/Japanese/Russian": languages,
        "base64 blob": base64.b64encode(rng.randbytes(12_000)).decode(),
    }


def rss_anon_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon"):
                return int(line.split()[1])
    return 0


def child_memory(kind: str, encoding: str) -> None:
    import tiktoken  # noqa: F401  (both sides import it; only what is built differs)

    import tests.tiktoken_reference  # noqa: F401  (both sides: unittest.mock comes with it)
    from agent_flow import tokens

    before = rss_anon_kb()
    started = time.perf_counter()
    if kind == "tiktoken":
        # As agent_flow used it until the eighth session: the Python dictionary of ranks,
        # which tiktoken keeps only to pickle the encoder, let go once the encoder is built.
        tiktoken_encoder(encoding)._mergeable_ranks = {}
        gc.collect()
    else:
        tokens.TiktokenCounter(MODEL[encoding])
    seconds = time.perf_counter() - started
    print(json.dumps({"mb": (rss_anon_kb() - before) / 1024, "seconds": seconds}))


def tiktoken_encoder(encoding: str) -> Any:
    """tiktoken's encoder, built from the rank file agent_flow reads (the reference)."""
    from tests.tiktoken_reference import tiktoken_encoding

    return tiktoken_encoding(encoding)


def memory(encoding: str) -> dict[str, dict[str, float]]:
    out = {}
    for kind in ("tiktoken", "agent_flow"):
        result = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--encoding", encoding],
            capture_output=True,
            text=True,
            check=True,
        )
        out[kind] = json.loads(result.stdout)
    return out


def speed(encoding: str, rounds: int) -> None:
    from agent_flow._bpe import BytePairCounter
    from agent_flow.tokens import TiktokenCounter

    theirs = tiktoken_encoder(encoding)
    engine = TiktokenCounter(MODEL[encoding])._encoding
    print(f"\nspeed, {encoding}: µs per 1,000 characters (best of {rounds}); tokens per character")
    columns = ("chars", "tiktoken", "ours cold", "ours warm", "tok/char")
    print(f"{'corpus':28} " + " ".join(f"{c:>9}" for c in columns))
    for name, text in corpora().items():
        expected = len(theirs.encode_ordinary(text))
        best = {"tiktoken": float("inf"), "cold": float("inf"), "warm": float("inf")}
        for _ in range(rounds):
            started = time.perf_counter()
            theirs.encode_ordinary(text)
            best["tiktoken"] = min(best["tiktoken"], time.perf_counter() - started)
            fresh = BytePairCounter(engine.ranks, engine.pattern)
            started = time.perf_counter()
            cold = fresh.count(text)
            best["cold"] = min(best["cold"], time.perf_counter() - started)
            started = time.perf_counter()
            warm = fresh.count(text)
            best["warm"] = min(best["warm"], time.perf_counter() - started)
            assert cold == warm == expected, (name, cold, warm, expected)
        per = 1e6 * 1000 / len(text)
        print(
            f"{name:28} {len(text):9d} {best['tiktoken'] * per:9.1f} {best['cold'] * per:9.1f} "
            f"{best['warm'] * per:9.1f} {expected / len(text):9.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoding", default="cl100k_base", choices=sorted(MODEL))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=["tiktoken", "agent_flow"])
    args = parser.parse_args()
    if args.child:
        child_memory(args.child, args.encoding)
        return
    with open("/proc/loadavg") as load:
        print(f"load average: {load.read().split()[0]}")
    built = memory(args.encoding)
    print(f"memory, {args.encoding}: what a fresh process gains building the counter")
    for kind, figures in built.items():
        print(f"  {kind:10} +{figures['mb']:5.1f} MB in {figures['seconds'] * 1000:5.0f} ms")
    speed(args.encoding, args.rounds)


if __name__ == "__main__":
    main()
