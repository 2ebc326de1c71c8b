"""A local Hugging Face hub cache of tiny stand-ins under the paper's real repo ids, for rehearsing
docs/paper_runs.md offline (tests/test_paper_guide_rehearsal.py).

`build_standin_hub` writes, in the layout `hf download` leaves in the cache (`models--Qwen--Qwen3-4B/`
with `refs/main`, `blobs/` and `snapshots/<commit>/` linking to them), one repo for each id the guide
downloads:

- each paper model: a tiny random causal LM of its family (`build_tiny_model`: head size 32, grouped-query
  attention, the real model's tied or untied head, the family's chat template);
- the e5 encoder: a tiny random BERT with a WordPiece tokenizer and the sentence-transformers files
  (mean pooling), as `intfloat/e5-base-v2` ships them;
- the datasets: made-up rows (`drmas_envs.testing`) in each repo's files and columns;
- the retrieval files: a made-up Search-R1 corpus (`wiki-18.jsonl.gz`) and a flat FAISS index of the
  stand-in encoder's passage vectors, split in two (`part_aa`, `part_ab`) as the real one is.

None of it is the real repo's content, and each says so: a README.md naming it a stand-in, and for models
a `drmas_stand_in` field in config.json. `hf_download` does offline what `hf download` does, from this cache.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from drmas_envs.testing import SEARCH_SOURCES, search_rows, write_math_hub_layout, write_rows
from drmas_train.testing.tiny import build_tiny_model

STAND_IN_FIELD = "drmas_stand_in"
"""The config.json field that marks a model folder as a stand-in."""

MODELS = {  # repo id -> (tiny family, tied output head as the real model)
    "Qwen/Qwen3-4B": ("qwen3", True),
    "Qwen/Qwen2.5-7B": ("qwen2", False),
    "Qwen/Qwen2.5-3B-Instruct": ("qwen2", True),
    "Qwen/Qwen2.5-7B-Instruct": ("qwen2", False),
    "meta-llama/Llama-3.2-3B-Instruct": ("llama", True),
}
ENCODER = "intfloat/e5-base-v2"
MATH_MEMBERS = {  # math_test's members: one stand-in row each, 50 for MATH-500 (math_test_sampled takes its first 50)
    "math500": 50,
    "aime24": 1,
    "aime25": 1,
    "olympiadbench": 1,
    "amc23": 1,
    "minerva": 1,
}
SEARCH_TRAIN = {"nq": 2, "hotpotqa": 2}
"""Stand-in rows of nq_hotpotqa_train's train split per source."""
SEARCH_TEST = dict.fromkeys(SEARCH_SOURCES, 1)
"""Stand-in rows of its test split per source (search_test and search_test_sampled alike)."""
SEARCH_REPO = "PeterJinGo/nq_hotpotqa_train"
INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
CORPUS_REPO = "PeterJinGo/wiki-18-corpus"


def _note(repo: str, what: str) -> str:
    return f"STAND-IN for {repo}: {what}. Not the real repo's content; made for rehearsing docs/paper_runs.md.\n"


def add_repo(cache: Path, repo: str, files: dict[str, Path | bytes], repo_type: str = "model") -> Path:
    """Write `files` (repo path -> source file or bytes) as one commit of `repo` in the hub cache `cache`."""
    folder = cache / f"{repo_type}s--{repo.replace('/', '--')}"
    commit = hashlib.sha1(f"stand-in {repo_type} {repo}".encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    for rel, source in files.items():
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return snapshot


def _folder_files(folder: Path) -> dict[str, Path | bytes]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def causal_lm(repo: str) -> dict[str, Path | bytes]:
    """The files of a tiny stand-in for the causal LM `repo` (its folder built once and cached)."""
    arch, tied = MODELS[repo]
    folder = build_tiny_model(
        arch=arch,
        hidden_size=64,
        num_heads=2,
        num_kv_heads=1,
        vocab_size=512 if arch == "llama" else 400,
        tie_word_embeddings=tied,
        suppress_eos=True,
    )
    files = {k: v for k, v in _folder_files(folder).items() if k != "drmas_tiny.json"}
    config = json.loads(Path(files["config.json"]).read_text())
    config[STAND_IN_FIELD] = f"tiny random {arch} weights standing in for {repo}"
    files["config.json"] = json.dumps(config, indent=2).encode()
    files["README.md"] = _note(repo, f"a tiny random {arch} model with a made-up tokenizer").encode()
    return files


def _wordpiece(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    names = dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=512, **names)


ST_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]
"""The sentence-transformers pipeline of the e5 repo: the transformer, then mean pooling."""


def encoder(folder: Path, texts: list[str], passages: list[str]) -> tuple[dict[str, Path | bytes], Any]:
    """A tiny random BERT sentence encoder written to `folder`, its tokenizer fitted to `texts`.

    Returns its files, and the unit vectors it gives `passages` (mean pooling, as its sentence-transformers
    files say).
    """
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = _wordpiece(texts)
    shape = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config = BertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id, **shape
    )
    config.update({STAND_IN_FIELD: f"tiny random BERT standing in for {ENCODER}"})
    torch.manual_seed(0)
    model = BertModel(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "modules.json").write_text(json.dumps(ST_MODULES))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
    )
    (folder / "README.md").write_text(_note(ENCODER, "a tiny random BERT encoder with a made-up tokenizer"))
    batch = tokenizer(passages, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    return _folder_files(folder), vectors.numpy()


def passages() -> list[tuple[str, str]]:
    """(title, text) of the stand-in corpus: one passage holding each stand-in search question's answer."""
    return [
        (f"{source} topic {i}", f"The {source} question {i} is answered by {source} answer {i}.")
        for source in SEARCH_SOURCES
        for i in range(2)
    ]


def flat_index_parts(vectors: Any, out: Path) -> tuple[bytes, bytes]:
    """A FAISS IndexFlatIP file of `vectors` (as the reference's e5_Flat.index), split in two halves."""
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(out))
    data = out.read_bytes()
    return data[: len(data) // 2], data[len(data) // 2 :]


def dapo_rows(n: int) -> list[dict]:
    """Rows of `aaabiao/dapo_filter` in verl's format: the problem in the user turn, `reward_model.ground_truth`."""
    suffix = " Let's think step by step and output the final answer within \\boxed{}."
    return [
        {
            "data_source": "dapo_filter",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?{suffix}"}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        }
        for i in range(n)
    ]


def build_standin_hub(cache: Path, work: Path) -> list[str]:
    """Write every stand-in repo into the hub cache `cache` (scratch files under `work`); returns their ids."""
    for repo in MODELS:
        add_repo(cache, repo, causal_lm(repo))
    data = work / "data"
    write_math_hub_layout(data, MATH_MEMBERS, parquet=True)
    write_rows(data / "aaabiao" / "dapo_filter" / "data" / "train-00000-of-00001.parquet", dapo_rows(4))
    write_rows(data / SEARCH_REPO / "train.parquet", search_rows("train", SEARCH_TRAIN))
    write_rows(data / SEARCH_REPO / "test.parquet", search_rows("test", SEARCH_TEST))
    repos = list(MODELS)
    for owner in sorted(p for p in data.iterdir()):
        for folder in sorted(owner.iterdir()):
            repo = f"{owner.name}/{folder.name}"
            files = _folder_files(folder)
            files["README.md"] = _note(repo, "a few made-up rows in the repo's files and columns").encode()
            add_repo(cache, repo, files, "dataset")
            repos.append(repo)
    corpus = passages()
    texts = [f"{title} {text}" for title, text in corpus] + [r["question"] for r in search_rows("test", SEARCH_TEST)]
    files, vectors = encoder(work / "encoder", texts, [f"passage: {title}. {text}" for title, text in corpus])
    add_repo(cache, ENCODER, files)
    part_aa, part_ab = flat_index_parts(vectors, work / "e5_Flat.index")
    note = _note(INDEX_REPO, "the stand-in encoder's vectors of the stand-in corpus").encode()
    add_repo(cache, INDEX_REPO, {"part_aa": part_aa, "part_ab": part_ab, "README.md": note}, "dataset")
    rows = [{"id": str(i), "contents": f'"{title}"\n{text}'} for i, (title, text) in enumerate(corpus)]
    packed = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode(), mtime=0)
    note = _note(CORPUS_REPO, "a few made-up passages").encode()
    add_repo(cache, CORPUS_REPO, {"wiki-18.jsonl.gz": packed, "README.md": note}, "dataset")
    return [*repos, ENCODER, INDEX_REPO, CORPUS_REPO]


def hf_download(argv: list[str], cache: Path) -> Path:
    """`hf download REPO [FILES...] [--repo-type T] [--local-dir D]` served from the hub cache `cache` alone.

    Without `--local-dir` the cached snapshot is returned; with it the files are copied there, as
    `hf download --local-dir` writes them. A repo or file missing from the cache raises.
    """
    from huggingface_hub import snapshot_download

    words = list(argv)
    options = {}
    for flag in ("--repo-type", "--local-dir"):
        if flag in words:
            at = words.index(flag)
            options[flag] = words[at + 1]
            del words[at : at + 2]
    repo, files = words[0], words[1:]
    snapshot = Path(
        snapshot_download(
            repo,
            repo_type=options.get("--repo-type", "model"),
            cache_dir=cache,
            allow_patterns=files or None,
            local_files_only=True,
        )
    )
    for name in files:
        if not (snapshot / name).is_file():
            raise FileNotFoundError(f"{repo} has no file {name} in {cache}")
    if "--local-dir" not in options:
        return snapshot
    target = Path(options["--local-dir"])
    for name in files or [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(snapshot / name, target / name)
    return target
