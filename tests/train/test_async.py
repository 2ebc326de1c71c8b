"""Bounded-staleness asynchronous training (`rollout.max_staleness`), on the smoke preset's tiny models.

- k = 0 is the synchronous loop: the same run through the producer thread gives the same metrics and
  weights, bit for bit (the producer's machinery changes nothing but when rollouts run).
- k >= 1, for every assignment: every call carries the version that sampled it, no step trains on a
  call more than k versions old, validation runs on the step's version; k = 1 repeats itself.
- Pushes land between requests: a real engine generating in one thread while another pushes new weights.
- The decoupled and plain off-policy corrections, on a real tiny learner.
"""

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from drmas_train.algorithm.records import CallRecord
from drmas_train.config import build_config
from drmas_train.engines.base import SamplingParams
from drmas_train.engines.transformers_backend import TransformersBackend
from drmas_train.learner import Learner, PPOConfig
from drmas_train.learner.loss import behaviour_weights
from drmas_train.placement.loopback import loopback_only
from drmas_train.rollout.versions import VersionedBackend, WeightClock, drop_stale_groups, staleness_stats
from drmas_train.run.trainer import Trainer
from drmas_train.testing.tiny import build_tiny_model

ASYNC = {"learner.old_logprobs": "decoupled", "log.tensorboard": False}


def _cfg(run_dir: Path, **overrides):
    return build_config("smoke", {"log.run_dir": str(run_dir), "log.tensorboard": False, **overrides})


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same(a: dict, b: dict) -> dict:
    """The keys whose values differ, wall-clock and memory figures aside."""
    skip = ("time/", "tokens/per_s", "mem/")
    return {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if not k.startswith(skip) and a.get(k) != b.get(k)}


def _weights(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {k: v.clone() for k, v in p.weights().items()} for name, p in trainer.policies.items()}


def test_k0_through_the_producer_is_the_synchronous_loop_bit_for_bit(tmp_path):
    sync = Trainer(_cfg(tmp_path / "sync"))
    assert not sync.pipelined
    sync_rows = sync.train()
    piped = Trainer(_cfg(tmp_path / "piped"))
    piped.pipelined = True  # the synchronous schedule, each batch rolled out by the producer thread
    piped_rows = piped.train()
    assert [r["step"] for r in piped_rows] == [1, 2]
    for a, b in zip(sync_rows, piped_rows):
        assert _same(a, b) == {}
        assert a["rollout/staleness_max"] == 0.0
    assert _same(sync.initial_validation, piped.initial_validation) == {}
    ws, wp = _weights(sync), _weights(piped)
    for name in ws:
        assert all(torch.equal(ws[name][k], wp[name][k]) for k in ws[name]), name
    assert sync_rows[-1]["val/weight_version"] == 2.0


@pytest.mark.parametrize(
    ("assignment", "k"),
    [("shared", 1), ("per_agent", 2), ("lora", 1), ("heterogeneous", 1)],
)
def test_bounded_staleness_records_versions_for_every_assignment(tmp_path, assignment, k):
    overrides = {**ASYNC, "models.assignment": assignment, "rollout.max_staleness": k, "steps": 4}
    if assignment == "heterogeneous":
        overrides["models.per_agent_names"] = {"verifier": "tiny-qwen2"}
    trainer = Trainer(_cfg(tmp_path / "run", **overrides))
    rows = trainer.train()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert 0 <= row["rollout/staleness_mean"] <= row["rollout/staleness_max"] <= k
        assert "rollout/dropped_groups" not in row  # the producer's bound keeps the filter idle
    assert rows[0]["rollout/staleness_max"] == 0.0  # step 1 is sampled by the initial weights
    if k == 1:  # the producer waits for each step's weights: every later step is exactly one version behind
        assert [r["rollout/staleness_mean"] for r in rows[1:]] == [1.0, 1.0, 1.0]
    assert [r["val/weight_version"] for r in rows if "val/weight_version" in r] == [2.0, 4.0]
    calls = [c for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
             for c in json.loads(line)["calls"]]  # fmt: skip
    assert calls and all(isinstance(c["weight_version"], int) for c in calls)
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    versions = [
        {c["weight_version"] for c in json.loads(line)["calls"]}
        for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    ]
    for step, seen in zip(steps, versions):
        assert all(step - 1 - k <= v <= step - 1 for v in seen), (step, seen)


def test_k1_repeats_itself_from_its_seed(tmp_path):
    overrides = {**ASYNC, "rollout.max_staleness": 1, "steps": 3, "eval.every": 0, "eval.before_train": False}
    first = Trainer(_cfg(tmp_path / "a", **overrides)).train()
    second = Trainer(_cfg(tmp_path / "b", **overrides)).train()
    for a, b in zip(first, second):
        assert _same(a, b) == {}


def test_staleness_needs_an_off_policy_correction_and_is_not_negative(tmp_path):
    with pytest.raises(ValueError, match="learner.old_logprobs to decoupled"):
        _cfg(tmp_path, **{"rollout.max_staleness": 1})
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        _cfg(tmp_path, **{"rollout.max_staleness": -1})
    with pytest.raises(ValueError, match="behaviour_weight_cap"):
        PPOConfig(behaviour_weight_cap=0.5)
    _cfg(tmp_path, **{"rollout.max_staleness": 2, "learner.old_logprobs": "sampled"})  # the plain form is fine


def _record(group: int, version: int | None) -> CallRecord:
    return CallRecord(group, group, "solver", "m", 0, [1], [2], [0.0], weight_version=version)


def test_stale_groups_are_dropped_whole_and_staleness_is_measured():
    records = [_record(0, 3), _record(0, 1), _record(1, 3), _record(2, 2)]
    kept = drop_stale_groups(records, trained_version=3, max_staleness=1)
    assert [(r.group_id, r.weight_version) for r in kept] == [(1, 3), (2, 2)]  # group 0 held a call 2 behind
    assert staleness_stats(kept, 3) == {"rollout/staleness_mean": 0.5, "rollout/staleness_max": 1.0}
    assert staleness_stats([_record(0, None)], 3) == {}  # unversioned engines: no staleness figures


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def test_no_generation_request_mixes_two_weight_versions(tiny_llama):
    """One thread generates while another pushes new weights; every decoding step of a request sees one version."""
    model, tokenizer = tiny_llama
    clock = WeightClock()
    engine = VersionedBackend(TransformersBackend(model, tokenizer, max_batch_size=8), clock)
    weight = model.get_output_embeddings().weight
    fingerprint = {0: float(weight.detach().sum())}  # version -> the weights' fingerprint
    seen: list[tuple[int, float]] = []  # (request, fingerprint) at every forward pass
    current = [0]
    hook = model.register_forward_pre_hook(lambda *_: seen.append((current[0], float(weight.detach().sum()))))
    sampling = [SamplingParams(temperature=1.0, max_new_tokens=12)] * 4
    stamped: dict[int, set] = {}
    done = threading.Event()

    def generate() -> None:
        for i in range(20):
            current[0] = i
            gens = engine.generate([[5, 6, 7, 8]] * 4, sampling, seed=i)
            stamped[i] = {g.version for g in gens}
        done.set()

    thread = threading.Thread(target=generate)
    thread.start()
    version = 0
    try:
        while not done.is_set() and version < 200:
            version += 1

            def apply(v=version) -> None:
                with torch.no_grad():
                    weight.add_(0.01)
                fingerprint[v] = float(weight.detach().sum())

            clock.push(version, apply)
            time.sleep(0.002)  # let the generating thread take the lock between pushes
    finally:
        thread.join()
        hook.remove()
    by_request: dict[int, set] = {}
    for request, value in seen:
        by_request.setdefault(request, set()).add(value)
    assert len(by_request) == 20 and version > 1
    for request, values in by_request.items():
        assert len(values) == 1, f"request {request} saw {len(values)} weight versions"
        (stamp,) = stamped[request]
        assert values == {fingerprint[stamp]}  # the stamped version is the one it ran on
    assert len({next(iter(s)) for s in stamped.values()}) > 1  # pushes did land between requests


def test_hold_keeps_a_push_out_until_the_batch_ends():
    clock, order = WeightClock(), []
    with clock.hold() as version:
        pusher = threading.Thread(target=lambda: clock.push(1, lambda: order.append("push")))
        pusher.start()
        pusher.join(timeout=0.2)
        assert pusher.is_alive() and version == 0  # the push waits for the held batch
        with clock.hold() as inner:  # re-entrant: the batch's own requests go through
            order.append(f"request at {inner}")
    pusher.join()
    assert order == ["request at 0", "push"] and clock.version == 1


# ---- the off-policy corrections on a real tiny learner -----------------------------------------


def _records_with_behaviour(model, shift: float) -> list[CallRecord]:
    """Records whose sampling log-probs are the model's own minus `shift` (an older, different policy)."""
    out = []
    g = torch.Generator().manual_seed(3)
    for i in range(4):
        prompt = torch.randint(5, model.config.vocab_size, (5,), generator=g).tolist()
        response = torch.randint(5, model.config.vocab_size, (4,), generator=g).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response])).logits[0].log_softmax(-1)
        own = [float(logits[len(prompt) - 1 + t, tok]) for t, tok in enumerate(response)]
        adv = 1.0 if i % 2 else -0.5
        out.append(CallRecord(0, i, "solver", "m", 0, prompt, response, [x - shift for x in own], advantage=adv))
    return out


def _grad(model, records, **knobs) -> torch.Tensor:
    import copy

    learner_model = copy.deepcopy(model)
    Learner(learner_model, PPOConfig(forward="plain", **knobs)).compute_gradients(records)
    return torch.cat([p.grad.flatten() for p in learner_model.parameters() if p.grad is not None])


def test_decoupled_weights_each_token_by_proximal_over_behaviour(tiny_llama):
    model, _ = tiny_llama
    on_policy = _records_with_behaviour(model, 0.0)
    recompute = _grad(model, on_policy)
    # Sampled by the current weights: weight 1, the synchronous gradient.
    torch.testing.assert_close(_grad(model, on_policy, old_logprobs="decoupled"), recompute, rtol=1e-4, atol=1e-7)
    # The behaviour policy gave every token half the probability: every token's loss weighs 2.
    stale = _records_with_behaviour(model, torch.log(torch.tensor(2.0)).item())
    torch.testing.assert_close(_grad(model, stale, old_logprobs="decoupled"), 2 * recompute, rtol=1e-4, atol=1e-7)
    # Above the cap the tokens are left out: no gradient at all.
    capped = _grad(model, stale, old_logprobs="decoupled", behaviour_weight_cap=1.5)
    assert float(capped.abs().max()) == 0.0
    # The plain form divides by the behaviour log-prob: the ratio is 2 and positive advantages are clipped
    # (no gradient), negative ones are not (ratio 2 < dual clip 3): a different gradient from both.
    plain = _grad(model, stale, old_logprobs="sampled")
    assert not torch.allclose(plain, recompute) and not torch.allclose(plain, 2 * recompute)


def test_behaviour_weights_by_hand():
    prox = torch.tensor([[0.0, -1.0, -2.0]])
    behaviour = torch.tensor([[0.0, -2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    weights = behaviour_weights(prox, behaviour, mask, cap=5.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, torch.e, 0.0]]))
    assert behaviour_weights(prox, behaviour, mask, cap=2.0).tolist() == [[1.0, 0.0, 0.0]]


@pytest.mark.slow
@pytest.mark.ray
def test_placed_pools_stay_within_the_bound_and_resume_on_the_checkpoint_version(tmp_path):
    """per_agent pools (one samples while the other updates), then a shared pool; the workers stamp the versions."""
    ray = pytest.importorskip("ray")
    with loopback_only():  # a local Ray on 127.0.0.1 only, as drmas-train starts it
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pools = {"placement.mode": "per_agent", "placement.pools.solver.cpus": 1, "placement.pools.verifier.cpus": 1}
        overrides = {**ASYNC, **pools, "models.assignment": "per_agent", "rollout.max_staleness": 1}
        run = tmp_path / "run"
        rows = Trainer(_cfg(run, steps=2, **overrides)).train()
        assert rows[0]["rollout/staleness_max"] == 0.0 and rows[1]["rollout/staleness_max"] <= 1.0
        assert rows[1]["val/weight_version"] == 2.0  # each worker counted its own updates
        # Resumed into one shared pool's worker (placement shared), which holds the checkpoint's weights and
        # version: step 3 is sampled by version 2.
        shared = {**overrides, "placement.mode": "shared", "placement.shared_pool.cpus": 2}
        resumed = Trainer(_cfg(run, steps=3, **shared), resume=True)
        assert resumed.step == 2
        row = resumed.train()[-1]
        assert row["step"] == 3 and row["rollout/staleness_max"] == 0.0 and "rollout/dropped_groups" not in row
        assert row["val/weight_version"] == 3.0
    finally:
        ray.shutdown()
