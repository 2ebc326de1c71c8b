"""Chat-template options (`models.chat_template_kwargs`, per agent `agents.<name>.chat_template_kwargs`).

The tiny Qwen3 carries a template that branches on `enable_thinking` as Qwen3's does: False pre-fills
an empty think block after the assistant header. The math preset sets it False, as the reference's
math script does (`+data.apply_chat_template_kwargs.enable_thinking=False`).
"""

from spies import record_prompts
from transformers import AutoTokenizer

from drmas_train.config import build_config
from drmas_train.engines.resolve import resolve_model
from drmas_train.rollout import chat_prompt
from drmas_train.run.trainer import Trainer

EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
OBS = {"system": "You are the Solver.", "user": "What is 3 + 4?"}


def test_chat_prompt_passes_the_options_to_the_template():
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-qwen3"))
    plain = tok.decode(chat_prompt(tok, OBS, 512))
    off = tok.decode(chat_prompt(tok, OBS, 512, {"enable_thinking": False}))
    on = tok.decode(chat_prompt(tok, OBS, 512, {"enable_thinking": True}))
    assert plain == on and plain.endswith("<|im_start|>assistant\n")
    assert off.endswith(EMPTY_THINK)


def test_math_preset_turns_thinking_off():
    cfg = build_config("math-2x-qwen3-4b")
    assert cfg.template_kwargs("solver") == cfg.template_kwargs("verifier") == {"enable_thinking": False}


def test_trainer_sends_each_agent_its_options(tmp_path):
    cfg = build_config(
        "smoke",
        {
            "models.name": "tiny-qwen3",
            "models.chat_template_kwargs": {"enable_thinking": False},
            "agents.verifier.chat_template_kwargs": {"enable_thinking": True},  # the agent's own wins
            "steps": 1,
            "eval.every": 0,
            "eval.before_train": False,
            "log.run_dir": str(tmp_path / "run"),
        },
    )
    trainer = Trainer(cfg)
    seen = record_prompts(trainer.policies["shared"].backend)
    trainer.train()
    texts = [trainer.policies["shared"].tokenizer.decode(p) for p in seen]
    solver = [t for t in texts if "You are the Solver" in t]
    verifier = [t for t in texts if "You are the Verifier" in t]
    assert solver and verifier and len(solver) + len(verifier) == len(texts)
    assert all(t.endswith(EMPTY_THINK) for t in solver)
    assert not any("<think>" in t for t in verifier)
