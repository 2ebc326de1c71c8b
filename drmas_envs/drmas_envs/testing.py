"""Made-up rows of the paper's datasets in the layout the hub serves them (what `hf download` writes), for
tests and benchmarks: never real data.

Rows carry the fields the reference's preprocessing reads (langfengQ/DrMAS examples/data_preprocess/
drmas_math.py and drmas_search.py); the texts are made up, the counts are the caller's. Parquet needs
pyarrow (`drmas-envs[data]`), imported only when a `.parquet` path is written.
"""

from __future__ import annotations

import json
from pathlib import Path

SEARCH_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
"""The seven sources of the reference's search data."""


def write_rows(path: Path, rows: list[dict]) -> Path:
    """Write rows as JSONL, or as Parquet when `path` ends in .parquet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def math500_rows(n: int) -> list[dict]:
    return [
        {
            "problem": f"MATH-500 problem {i}: what is {i} + {i}?",
            "solution": f"It is $\\boxed{{{2 * i}}}$.",
            "answer": str(2 * i),
            "subject": "Algebra",
            "level": 1,
            "unique_id": f"test/algebra/{i}.json",
        }
        for i in range(n)
    ]


def aime24_rows(n: int = 30) -> list[dict]:
    return [
        {"id": 60 + i, "problem": f"AIME 2024 problem {i}", "solution": "...", "answer": str(100 + i), "url": "u"}
        for i in range(n)
    ]


def aime25_rows(n: int = 30) -> list[dict]:
    # MathArena's copy numbers its problems and stores answers as integers
    return [{"problem_idx": i + 1, "problem": f"AIME 2025 problem {i}", "answer": 200 + i} for i in range(n)]


def plain_rows(name: str, n: int) -> list[dict]:
    return [{"problem": f"{name} problem {i}", "answer": f"{i}"} for i in range(n)]


def write_math_hub_layout(root: Path, counts: dict[str, int], parquet: bool = False) -> dict[str, Path]:
    """The reference's math test sources under `root/<owner>/<name>/`, `counts[member]` rows each."""
    ext = "parquet" if parquet else "jsonl"
    shard = f"data/{{split}}-00000-of-00001.{ext}"
    layout = {
        "math500": ("HuggingFaceH4/MATH-500", f"test.{ext}" if not parquet else shard.format(split="test")),
        "aime24": ("HuggingFaceH4/aime_2024", shard.format(split="train")),
        "aime25": ("MathArena/aime_2025", shard.format(split="train")),
        "olympiadbench": ("realtreetune/olympiadbench", shard.format(split="test")),
        "amc23": ("knoveleng/AMC-23", shard.format(split="train")),
        "minerva": ("zwhe99/simplerl-minerva-math", shard.format(split="test")),
    }
    makers = {"math500": math500_rows, "aime24": aime24_rows, "aime25": aime25_rows}
    written = {}
    for member, n in counts.items():
        repo, rel = layout[member]
        rows = makers[member](n) if member in makers else plain_rows(member, n)
        written[member] = write_rows(root / repo / rel, rows)
    return written


def search_rows(split: str, counts: dict[str, int]) -> list[dict]:
    """Search-R1 rows (`PeterJinGo/nq_hotpotqa_train`): contiguous blocks per `data_source`."""
    rows = []
    for source, n in counts.items():
        for i in range(n):
            rows.append(
                {
                    "id": f"{split}_{i}",
                    "question": f"{source} question {i}?",
                    "golden_answers": [f"{source} answer {i}", f"alias {i}"],
                    "data_source": source,
                    "prompt": [{"role": "user", "content": "Answer the given question. ..."}],
                    "ability": "fact-reasoning",
                    "reward_model": {"style": "rule", "ground_truth": {"target": [f"{source} answer {i}"]}},
                    "extra_info": {"split": split, "index": i},
                }
            )
    return rows


MATH_SAMPLED_SOURCES = ("math500_first50", "aime24", "aime25")
"""The `data_source` tags of the reference's `drmas_math/test_sampled.parquet`."""
MATH_TEST_SOURCES = ("math500", "aime24", "aime25", "olympiadbench", "amc23", "minerva")
"""The `data_source` tags of the reference's `drmas_math/test.parquet`."""


def reference_math_rows(split: str, counts: dict[str, int]) -> list[dict]:
    """Rows as the reference's `examples/data_preprocess/drmas_math.py` writes them (made-up problems)."""
    rows = []
    for source, n in counts.items():
        for i in range(n):
            question, truth = f"{source} problem {i}: what is {i} + 1?", str(i + 1)
            rows.append(
                {
                    "data_source": source,
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": truth},
                    "prompt": [{"role": "user", "content": question}],
                    "extra_info": {"split": split, "index": i, "answer": truth, "question": question},
                    "env_kwargs": {"ground_truth": truth, "question": question, "data_source": source},
                }
            )
    return rows


def reference_search_rows(split: str, counts: dict[str, int]) -> list[dict]:
    """Rows as the reference's `examples/data_preprocess/drmas_search.py` writes them: no top-level
    `question` or `golden_answers`; both in `env_kwargs` (made-up questions).
    """
    rows = []
    for source, n in counts.items():
        for i in range(n):
            question, truth = f"{source} question {i}?", {"target": [f"{source} answer {i}"]}
            rows.append(
                {
                    "data_source": source,
                    "prompt": [{"role": "system", "content": "..."}, {"role": "user", "content": question}],
                    "ability": "fact-reasoning",
                    "reward_model": {"style": "rule", "ground_truth": truth},
                    "extra_info": {"index": i, "need_tools_kwargs": True, "question": question, "split": split},
                    "env_kwargs": {"ground_truth": truth, "question": question, "data_source": source},
                }
            )
    return rows


def write_reference_layout(root: Path, task: str, counts: dict[str, dict[str, int]]) -> dict[str, Path]:
    """`root/drmas_<task>/<split>.parquet` for each split in `counts` (split -> source -> rows), as the
    reference's preprocessing writes them to `~/data/drmas_<task>/`.
    """
    make = reference_math_rows if task == "math" else reference_search_rows
    return {
        split: write_rows(root / f"drmas_{task}" / f"{split}.parquet", make(split.split("_")[0], per_source))
        for split, per_source in counts.items()
    }
