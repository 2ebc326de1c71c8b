"""`rollout.truncation`: which part of an over-long prompt is cut (verl's `data.truncation`).

The reference cuts math prompts in the middle (`data.truncation='middle'`, run_math.sh) and search
prompts on the left (`data.truncation='left'`, run_search.sh: the latest search results are kept).
"""

import pytest
from spies import record_prompts
from transformers import AutoTokenizer

from drmas_train.config import build_config
from drmas_train.engines.resolve import resolve_model
from drmas_train.rollout import chat_prompt
from drmas_train.run.trainer import Trainer

OBS = {"system": "You are the Solver. " * 30, "user": "Solve it. " * 30 + "What is 3 + 4?"}
HEADER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model("tiny-qwen3"))


def test_each_side_keeps_its_part(tok):
    whole = chat_prompt(tok, OBS, 100_000)
    assert len(whole) > 100
    middle = chat_prompt(tok, OBS, 64)
    assert middle == whole[:32] + whole[-32:]
    assert chat_prompt(tok, OBS, 64, truncation="middle") == middle  # the default
    assert chat_prompt(tok, OBS, 64, truncation="left") == whole[-64:]
    assert chat_prompt(tok, OBS, 64, truncation="right") == whole[:64]
    with pytest.raises(ValueError, match=rf"{len(whole)} tokens is longer than the 64 allowed"):
        chat_prompt(tok, OBS, 64, truncation="error")
    assert chat_prompt(tok, OBS, len(whole), truncation="error") == whole  # a prompt that fits is never cut


def test_the_reply_prefix_follows_the_cut_on_every_side(tok):
    obs = {**OBS, "reply_prefix": "<verify>"}
    tail = tok.encode("<verify>", add_special_tokens=False)
    whole = chat_prompt(tok, OBS, 100_000)
    left = chat_prompt(tok, obs, 64, truncation="left")
    assert len(left) == 64 and left == whole[-(64 - len(tail)) :] + tail


def test_a_bad_side_is_a_config_error():
    with pytest.raises(ValueError, match=r"rollout.truncation must be one of \('middle', 'left', 'right', 'error'\)"):
        build_config("smoke", {"rollout.truncation": "centre"})


def _trainer(tmp_path, side):
    cfg = build_config(
        "smoke",
        {
            "models.name": "tiny-qwen3",
            "rollout.max_prompt_tokens": 48,
            "rollout.truncation": side,
            "steps": 1,
            "eval.every": 1,
            "eval.before_train": False,
            "eval.n_problems": 1,
            "eval.k": 1,
            "log.run_dir": str(tmp_path / "run"),
        },
    )
    return Trainer(cfg)


def test_training_and_validation_cut_on_the_configured_side(tmp_path):
    trainer = _trainer(tmp_path, "left")
    seen = record_prompts(trainer.policies["shared"].backend)
    rows = trainer.train()
    assert any(k.startswith("val/") for k in rows[-1])  # the validation ran too
    texts = [trainer.policies["shared"].tokenizer.decode(p) for p in seen]
    assert texts and all(len(p) == 48 for p in seen)  # every math prompt is longer than 48 tokens
    assert all(t.endswith(HEADER) and not t.startswith("<|im_start|>system") for t in texts)


def test_error_side_stops_the_run(tmp_path):
    trainer = _trainer(tmp_path, "error")
    try:
        with pytest.raises(ValueError, match="longer than the 48 allowed"):
            trainer.train()
    finally:
        trainer.close()


def test_eval_cli_takes_the_side():
    from drmas_train.cli.eval import eval_config, eval_parser, run_eval

    argv = ["--env", "math-1agent", "--model", "tiny-qwen3", "--k", "1", "--n-problems", "2", "--threads", "1"]
    argv += ["--max-new-tokens", "4", "--max-prompt-tokens", "32", "--env-arg", "level=[1]", "--preset", "smoke"]
    assert eval_config(eval_parser().parse_args(argv))[0].rollout.truncation == "middle"  # the preset's
    assert run_eval(eval_parser().parse_args([*argv, "--truncation", "left"]))["n_problems"] == 2
    with pytest.raises(ValueError, match="longer than the 32 allowed"):
        run_eval(eval_parser().parse_args([*argv, "--truncation", "error"]))
