"""The learner's peak memory at Qwen's vocabulary: log-probs and entropy are computed in LM-head chunks.

A tiny random Llama with the real Qwen vocabulary (151,936 tokens) takes one PPO update on a
4096-token response. Whole, the response's fp32 logits alone are [1, 4096, 151936] = 2.49 GB (and
an unchunked log-softmax, entropy and backward hold several such tensors). The update runs in a
fresh process, whose resident-set high-water mark is reset just before it (Linux `clear_refs`);
the growth must stay well below one full logits tensor.
"""

import json
import subprocess
import sys

import pytest

FULL_LOGITS_BYTES = 4096 * 151936 * 4

SCRIPT = r"""
import json, resource, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from drmas_train.learner import Learner, PPOConfig
from drmas_train.algorithm.records import CallRecord

torch.set_num_threads(1)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8192,
                     tie_word_embeddings=True)
model = LlamaForCausalLM(config).float()
model.config._attn_implementation = "sdpa"

def record(n_response, seed):
    g = torch.Generator().manual_seed(seed)
    response = torch.randint(0, 151936, (n_response,), generator=g).tolist()
    return CallRecord(0, seed, "solver", "m", 0, torch.randint(0, 151936, (16,), generator=g).tolist(),
                      response, [0.0] * n_response, advantage=1.0, temperature=0.7)

learner = Learner(model, PPOConfig(lr=1e-4, **json.loads(sys.argv[1])))
learner.update([record(8, 1)])  # allocates AdamW's state, so the measured update only adds activations

def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the high-water mark (VmHWM) to the current RSS
before = rss_kib("VmRSS:")
metrics = learner.update([record(4096, 2)])
peak = rss_kib("VmHWM:")
print(json.dumps({"growth": (peak - before) * 1024, "n_tokens": metrics["n_tokens"],
                  "entropy": metrics["entropy"], "grad_norm": metrics["grad_norm"]}))
"""


def run_update(ppo: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(ppo)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_update_on_a_4096_token_response_at_qwen_vocabulary_stays_well_below_the_logits_size():
    result = run_update({})
    assert result["n_tokens"] == 4096 and result["grad_norm"] > 0 and result["entropy"] > 0
    assert result["growth"] < 0.4 * FULL_LOGITS_BYTES, f"peak grew by {result['growth'] / 2**30:.2f} GiB"
