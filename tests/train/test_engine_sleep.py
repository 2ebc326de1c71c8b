"""Engines that sleep (`models.engine.sleep`, `engines.sleep`), on real tiny models on the CPU.

- A transformers engine with weights of its own frees them when it sleeps (every parameter on the meta
  device, the old tensors gone), refuses to generate asleep, and after wake + push generates exactly
  what an engine that never slept generates (greedy); tied embeddings stay tied.
- One that shares the learner's module has nothing to free: its sleep is a no-op that says so.
- `SleepingEngine` keeps the order wake weights -> push -> wake cache -> generate -> sleep, and a push
  while asleep is dropped (the next wake pushes the current weights).
- A trainer run with `models.engine.sleep` on (one model per agent): each generation wakes, pushes,
  generates and puts to sleep one engine, in that order, so one engine is awake at a time.
- vLLM on a CPU has no sleep mode: one start-up line says so and the engine stays resident (slow).
"""

import copy
import gc
import logging
import weakref

import pytest
import torch
from spies import record_engine_calls
from transformers import AutoModelForCausalLM, AutoTokenizer

from drmas_train.config import EngineConfig, build_config
from drmas_train.engines.base import EngineAsleepError, SamplingParams, Sleeper
from drmas_train.engines.resolve import resolve_model
from drmas_train.engines.sleep import SHARES_LEARNER, SleepingEngine, resident_bytes, sleep_engines
from drmas_train.engines.transformers_backend import TransformersBackend
from drmas_train.run.trainer import Trainer

GREEDY = [SamplingParams(temperature=0.0, max_new_tokens=8)] * 2


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    path = resolve_model("tiny-math")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _prompts(tok):
    chats = [[{"role": "user", "content": "What is 3 + 4?"}], [{"role": "user", "content": "Check 2 + 2 = 5."}]]
    return [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats]


def _ids(gens):
    return [g.response_ids for g in gens]


def test_sleep_frees_the_engines_own_weights_and_wake_push_generates_the_same(tiny):
    learner, tok = tiny
    never_slept = TransformersBackend(learner, tok)
    expected = _ids(never_slept.generate(_prompts(tok), GREEDY))
    engine = TransformersBackend(copy.deepcopy(learner), tok, own_weights=True)
    assert isinstance(engine, Sleeper) and engine.resident_because is None
    held = resident_bytes(engine.model)
    assert held > 0
    old = weakref.ref(engine.model.get_input_embeddings().weight)
    engine.sleep()
    gc.collect()
    assert engine.asleep
    assert resident_bytes(engine.model) == 0  # every parameter on the meta device
    assert old() is None  # and the tensors it held are gone
    with pytest.raises(EngineAsleepError, match="asleep"):
        engine.generate(_prompts(tok), GREEDY)
    with pytest.raises(EngineAsleepError):
        engine.load_weights(learner.named_parameters())  # weights not woken yet
    engine.wake_weights()
    assert resident_bytes(engine.model) == held
    with pytest.raises(EngineAsleepError):
        engine.generate(_prompts(tok), GREEDY)  # cache not woken yet
    engine.load_weights(learner.named_parameters())
    engine.wake_cache()
    assert not engine.asleep
    head, embed = engine.model.get_output_embeddings().weight, engine.model.get_input_embeddings().weight
    assert head is embed  # the tiny model ties them; a wake keeps the tie
    assert _ids(engine.generate(_prompts(tok), GREEDY)) == expected


def test_an_engine_on_the_learners_module_has_nothing_to_free(tiny):
    learner, tok = tiny
    engine = TransformersBackend(learner, tok)
    assert engine.resident_because == SHARES_LEARNER
    held = resident_bytes(learner)
    engine.sleep()
    assert not engine.asleep and resident_bytes(learner) == held
    assert engine.generate(_prompts(tok)[:1], GREEDY[:1])


def test_sleeping_engine_wakes_pushes_generates_and_sleeps_in_that_order(tiny):
    learner, tok = tiny
    trained = copy.deepcopy(learner)
    engine = TransformersBackend(copy.deepcopy(learner), tok, own_weights=True)
    calls = record_engine_calls(engine)
    wrapped = SleepingEngine(engine, lambda: trained.named_parameters())
    wrapped.sleep()
    with torch.no_grad():  # the learner moves on while the engine sleeps; the push it is sent is dropped
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
    wrapped.load_weights(trained.named_parameters())
    gens = wrapped.generate(_prompts(tok), GREEDY)
    assert calls == ["sleep", "wake_weights", "load_weights", "wake_cache", "generate", "sleep"]
    assert engine.asleep and resident_bytes(engine.model) == 0
    assert _ids(gens) == _ids(TransformersBackend(trained, tok).generate(_prompts(tok), GREEDY))


def test_sleep_engines_wraps_each_engine_once_and_says_which_stay_resident(tiny, caplog):
    learner, tok = tiny

    class Policy:  # what sleep_engines reads of a policy
        def __init__(self, name, backend):
            self.name, self.backend, self.module = name, backend, learner

    shared = TransformersBackend(learner, tok)
    own = TransformersBackend(copy.deepcopy(learner), tok, own_weights=True)
    policies = {"a": Policy("a", shared), "b": Policy("b", shared), "c": Policy("c", own)}
    with caplog.at_level(logging.WARNING, logger="drmas_train.engines.sleep"):
        sleep_engines(policies)
    assert policies["a"].backend is policies["b"].backend
    assert all(isinstance(p.backend, SleepingEngine) and p.backend.asleep for p in policies.values())
    assert own.asleep and not shared.asleep
    lines = [r.getMessage() for r in caplog.records if r.name == "drmas_train.engines.sleep"]
    assert len(lines) == 1 and SHARES_LEARNER in lines[0] and "(a)" in lines[0]


def test_a_trainer_step_wakes_pushes_generates_and_sleeps_one_engine_at_a_time(tmp_path):
    cfg = build_config(
        "smoke",
        {
            "log.run_dir": str(tmp_path),
            "log.tensorboard": False,
            "steps": 1,
            "eval.every": 0,
            "eval.before_train": False,
            "models.assignment": "per_agent",
            "models.engine.sleep": True,
        },
    )
    trainer = Trainer(cfg)
    calls: list[tuple[str, str]] = []
    for name, policy in trainer.policies.items():
        engine = policy.backend.inner.inner  # VersionedBackend -> SleepingEngine -> the transformers engine
        record_engine_calls(engine, calls, tag=name)
    trainer.train()
    per_call = ["wake_weights", "load_weights", "wake_cache", "generate", "sleep"]
    blocks = [calls[i : i + len(per_call)] for i in range(0, len(calls), len(per_call))]
    assert {tag for tag, _ in calls} == {"solver", "verifier"}  # both models generated
    for block in blocks:  # each generation: one engine woken, pushed, generating and asleep again
        assert [call for _, call in block] == per_call and len({tag for tag, _ in block}) == 1


def test_sleep_does_not_combine_with_overlap_or_a_rollout_pool():
    overlap = {"rollout.max_staleness": 1, "learner.old_logprobs": "decoupled"}
    pool = {"placement.mode": "shared", "placement.rollout_pool.cpus": 1}
    for overrides in (overlap, pool):
        build_config("smoke", overrides)  # each is a valid run without sleep
        with pytest.raises(ValueError, match="models.engine.sleep"):
            build_config("smoke", {"models.engine.sleep": True, **overrides})


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_on_a_cpu_says_so_once_and_stays_resident(caplog):
    pytest.importorskip("vllm")
    from drmas_train.engines.vllm_backend import VLLMBackend
    from drmas_train.testing.tiny import build_tiny_model

    path = build_tiny_model(arch="llama", hidden_size=64, num_heads=2)
    tok = AutoTokenizer.from_pretrained(path)
    engine = VLLMBackend(path, EngineConfig(max_model_len=256, kv_cache_gib=0.0625, sleep=True), tokenizer=tok)
    try:
        assert "CPU" in engine.resident_because and not engine.asleep

        class Policy:
            name, module, backend = "solver", None, engine

        policies = {"solver": Policy()}
        with caplog.at_level(logging.WARNING, logger="drmas_train.engines.sleep"):
            sleep_engines(policies)
        assert policies["solver"].backend is engine  # not wrapped: resident
        said = [r.getMessage() for r in caplog.records if r.name == "drmas_train.engines.sleep"]
        assert len(said) == 1 and "stay resident" in said[0] and "CPU" in said[0]
        assert engine.generate(_prompts(tok), GREEDY)
    finally:
        engine.close()
