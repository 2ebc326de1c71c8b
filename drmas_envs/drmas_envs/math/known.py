"""The math datasets known by name: local file names, hub sources, field names, and the paper's mixes.

The hub ids of the paper's sets are the ones the reference's preprocessing loads
(langfengQ/DrMAS@19c632b examples/data_preprocess/drmas_math.py): training on `aaabiao/dapo_filter`,
validation during training on `math_test_sampled`, final evaluation on `math_test`. `dapo` is a
different set (open-r1's processed DAPO-Math-17k) and stays a separate name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from drmas_envs.hub import HubSplit

PLAIN_PROBLEM_KEYS = ("problem", "question", "Problem")
PLAIN_ANSWER_KEYS = ("answer", "final_answer", "Answer", "solution")


@dataclass(frozen=True)
class HubSource:
    """Where a known dataset lives on the Hugging Face hub, and which fields hold problem and answer.

    A key may be a dotted path into nested fields (`reward_model.ground_truth`); a problem field
    holding chat messages (verl's `prompt`) gives its user turn.
    """

    repo: str
    split: str
    problem_keys: tuple[str, ...] = PLAIN_PROBLEM_KEYS
    answer_keys: tuple[str, ...] = PLAIN_ANSWER_KEYS
    config: str | None = None
    revision: str | None = None

    @property
    def hub_split(self) -> HubSplit:
        """The repo split to look for, locally in the hub's layout or on the hub."""
        return HubSplit(self.repo, self.split, self.config, self.revision)


@dataclass(frozen=True)
class KnownDataset:
    """A dataset known by name: local file names per split, and a hub source per split."""

    files: Mapping[str, tuple[str, ...]]
    hub: Mapping[str, HubSource]
    default_split: str


@dataclass(frozen=True)
class Member:
    """One part of a mix: a known dataset's default split, its first `take` items, tagged `source`."""

    dataset: str
    source: str
    take: int | None = None


def _known(split: str, files: tuple[str, ...], hub: HubSource | None) -> KnownDataset:
    return KnownDataset({split: files}, {split: hub} if hub else {}, split)


# The paper's test sets point at the copies the reference loads, so a run's numbers compare with it;
# a local file under a flat name (e.g. another copy of the same benchmark) still wins, and the run's
# provenance records which one was used.
KNOWN: dict[str, KnownDataset] = {
    "math500": _known("test", ("math500.jsonl",), HubSource("HuggingFaceH4/MATH-500", "test")),
    "aime24": _known("test", ("aime24.jsonl", "aime_2024.jsonl"), HubSource("HuggingFaceH4/aime_2024", "train")),
    "aime25": _known("test", ("aime25.jsonl", "aime_2025.jsonl"), HubSource("MathArena/aime_2025", "train")),
    "amc23": _known("test", ("amc23.jsonl",), HubSource("knoveleng/AMC-23", "train")),
    "minerva": _known(
        "test", ("minerva_math.jsonl", "minerva.jsonl"), HubSource("zwhe99/simplerl-minerva-math", "test")
    ),
    "olympiadbench": _known("test", ("olympiadbench.jsonl",), HubSource("realtreetune/olympiadbench", "test")),
    "gsm8k": KnownDataset(
        {"test": ("gsm8k_test.jsonl", "gsm8k.jsonl"), "train": ("gsm8k_train.jsonl",)},
        {s: HubSource("openai/gsm8k", s, config="main") for s in ("test", "train")},
        "test",
    ),
    "math_train": _known(
        "train",
        ("math_train.jsonl",),
        HubSource("DigitalLearningGmbH/MATH-lighteval", "train", answer_keys=("solution",)),
    ),
    "dapo": _known(
        "train",
        ("dapo.jsonl", "dapo_math_17k.jsonl"),
        HubSource("open-r1/DAPO-Math-17k-Processed", "train", ("prompt",), ("solution",), config="en"),
    ),
    "dapo_filter": _known(
        "train",
        ("dapo_filter.jsonl", "dapo_filter.parquet"),
        HubSource(
            "aaabiao/dapo_filter",
            "train",
            ("problem", "prompt"),
            ("answer", "reward_model.ground_truth"),
        ),
    ),
    "aime_train": _known("train", ("aime_1983_2023_train.jsonl",), None),
    "amc22_23": _known("test", ("amc_2022_2023.jsonl",), None),
}
KNOWN["math"] = KnownDataset(
    {"train": KNOWN["math_train"].files["train"], "test": KNOWN["math500"].files["test"]},
    {"train": KNOWN["math_train"].hub["train"], "test": KNOWN["math500"].hub["test"]},
    "test",
)

# The reference's `test_sampled.parquet` and `test.parquet`, in its order and with its `data_source`
# tags (so per-source validation metrics carry the reference's names).
MIXES: dict[str, tuple[Member, ...]] = {
    "math_test_sampled": (
        Member("math500", "math500_first50", take=50),
        Member("aime24", "aime24"),
        Member("aime25", "aime25"),
    ),
    "math_test": (
        Member("math500", "math500"),
        Member("aime24", "aime24"),
        Member("aime25", "aime25"),
        Member("olympiadbench", "olympiadbench"),
        Member("amc23", "amc23"),
        Member("minerva", "minerva"),
    ),
}
