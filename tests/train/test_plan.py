"""`drmas-train plan`: every preset offline (text and JSON), measured prompt lengths, missing data, the fits verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from drmas_train.cli import main
from drmas_train.config import build_config, list_presets
from drmas_train.engines.resolve import resolve_model
from drmas_train.plan.arch import KNOWN_ARCHS, arch_from_folder
from drmas_train.plan.memory import GIB, train_state

KEYS = {
    "train_dataset",
    "eval_dataset",
    "steps_per_epoch",
    "prompt_tokens",
    "truncated_share",
    "gpu_memory_gib",
    "fits",
}
PAPER = (
    "math-2x-qwen3-4b",
    "search-3x-qwen2.5-7b",
    "search-3x-qwen2.5-3b",
    "search-shared-qwen2.5-7b",
    "search-heterogeneous",
)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)


def plan(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["plan", "--offline", "--sample", "8", *argv])
    return rc, capsys.readouterr().out


def plan_json(capsys, *argv: str) -> dict:
    rc, out = plan(capsys, "--json", *argv)
    assert rc == 0, out
    return json.loads(out)


@pytest.mark.parametrize("preset", list_presets())
def test_plan_of_every_preset_offline_text_and_json(preset, capsys):
    p = plan_json(capsys, "--preset", preset)
    assert KEYS <= set(p)
    assert isinstance(p["fits"], bool)
    train = p["train_dataset"]
    assert train["name"]
    if train["size"] is None:  # a preset naming data that is not here: named, and planned without it
        assert train["missing"] and p["steps_per_epoch"] is None and p["prompt_tokens"]["status"] == "no data"
    else:
        assert p["steps_per_epoch"] == train["size"] // build_config(preset).rollout.prompts_per_step
    assert p["gpu_memory_gib"]["per_rank"] and all(r["total"] > 0 for r in p["gpu_memory_gib"]["per_rank"])
    assert p["engines"] and all(
        e["max_model_len"] == build_config(preset).models.engine.max_model_len for e in p["engines"]
    )
    assert p["estimate"]["step_s"] > 0 and "an estimate, not a measurement" in p["estimate"]["assumptions"]
    rc, text = plan(capsys, "--preset", preset)
    assert rc == 0
    for line in ("train data:", "eval data:", "steps per epoch", "prompt tokens", "memory per", "verdict:", "ESTIMATE"):
        assert line in text, line


@pytest.mark.parametrize("preset", PAPER)
def test_paper_presets_plan_gpu_memory_from_the_tables_numbers_and_label_token_counts_an_estimate(preset, capsys):
    p = plan_json(capsys, "--preset", preset)
    assert p["gpu_memory_gib"]["device"] == "gpu" and p["gpu_memory_gib"]["projection"] is True
    assert p["gpu_memory_gib"]["declared"] == build_config(preset).placement.gpu_memory_gib
    assert all("no tokenizer" in m["source"] and m["params"] > 1e9 for m in p["models"])
    # Never another model's (e.g. the tiny test) tokenizer: estimated, or no data when the preset's set is not here.
    assert p["prompt_tokens"]["status"].startswith("estimate") or p["prompt_tokens"]["status"] == "no data"
    assert all(r["unit"].startswith("tokens (estimate") for r in p["prompt_tokens"]["per_agent"])
    assert p["estimate"]["gpus"] == build_config(preset).placement.shared_pool.ranks and p["estimate"]["gpu_hours"] > 0


def test_cpu_preset_prompt_lengths_are_smollm2_tokens_of_the_envs_real_prompts(capsys):
    import drmas_envs

    p = plan_json(capsys, "--preset", "cpu")
    prompts = p["prompt_tokens"]
    assert prompts["status"] == "measured" and prompts["sample_tasks"] == 8
    first = next(r for r in prompts["per_agent"] if r["agent"] == "solver" and r["turn"] == "first")
    # The same count by hand: the env's first observation through SmolLM2's own chat template.
    tok = transformers.AutoTokenizer.from_pretrained(str(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")))
    env = drmas_envs.make("math-2agent", **build_config("cpu").env.kwargs)
    lengths = []
    for i in range(len(env.unwrapped.tasks))[:50]:
        env.reset(options={"task_index": i})
        obs = env.observe("solver")
        msgs = [{"role": "system", "content": obs["system"]}, {"role": "user", "content": obs["user"]}]
        lengths.append(len(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)))
    assert min(lengths) <= first["p50"] <= max(lengths) and first["max"] <= max(lengths) + 5
    assert prompts["truncated_share"] == 0.0 and first["unit"] == "tokens"


def test_prompts_over_the_cap_count_as_truncated(capsys):
    p = plan_json(
        capsys, "--preset", "cpu", "--set", "rollout.max_prompt_tokens=100", "--set", "models.engine.max_model_len=200"
    )
    first = next(r for r in p["prompt_tokens"]["per_agent"] if r["turn"] == "first")
    assert first["p50"] > 100 and first["truncated_share"] == 1.0 and p["truncated_share"] == 1.0


def test_missing_dataset_is_named_with_how_to_fetch_it_and_the_rest_is_still_planned(capsys, tmp_path):
    args = (
        "--preset",
        "math-2x-qwen3-4b",
        "--set",
        "env.kwargs.dataset=math500",
        "--set",
        f"env.kwargs.data_dir={tmp_path}",
    )
    p = plan_json(capsys, *args)
    assert p["train_dataset"]["size"] is None and "math500" in p["train_dataset"]["missing"]
    assert "DRMAS_DATA_DIR" in p["train_dataset"]["missing"] and p["eval_dataset"]["missing"]
    assert p["steps_per_epoch"] is None and p["prompt_tokens"]["status"] == "no data" and p["truncated_share"] is None
    assert isinstance(p["fits"], bool) and p["estimate"]["step_s"] > 0  # memory and time from what is known
    rc, text = plan(capsys, *args)
    assert rc == 0 and "NOT FOUND" in text and "no data" in text and "missing data: math500" in text


def test_missing_search_dataset(capsys, tmp_path):
    p = plan_json(
        capsys,
        "--preset",
        "search-shared-qwen2.5-7b",
        "--set",
        "env.kwargs.dataset=nq",
        "--set",
        f"env.kwargs.data_dir={tmp_path}",
    )
    assert "nq" in p["train_dataset"]["missing"] and p["prompt_tokens"]["status"] == "no data"
    assert p["agents"] == ["verifier", "search", "answer"]


def test_fits_verdict_follows_the_declared_gpu_memory(capsys):
    big = plan_json(capsys, "--preset", "search-3x-qwen2.5-3b", "--set", "placement.gpu_memory_gib=400")
    small = plan_json(capsys, "--preset", "search-3x-qwen2.5-3b", "--set", "placement.gpu_memory_gib=20")
    assert big["fits"] is True and small["fits"] is False
    assert all(r["fits"] for r in big["gpu_memory_gib"]["per_rank"])
    assert any("needs" in msg for r in small["gpu_memory_gib"]["per_rank"] for msg in r["problems"])


def test_the_hardware_label_and_speed_follow_the_named_gpu_not_its_memory(capsys):
    runs = {
        kind: plan_json(capsys, "--preset", "search-3x-qwen2.5-3b", "--set", f"placement.gpu_kind={kind}")["estimate"]
        for kind in ("h100-sxm", "h200", "a100-80gb")
    }
    assert [runs[k]["hardware"] for k in runs] == ["NVIDIA H100 SXM", "NVIDIA H200 SXM", "NVIDIA A100 80GB SXM"]
    assert runs["h200"]["step_s"] < runs["h100-sxm"]["step_s"] < runs["a100-80gb"]["step_s"]
    same_memory = plan_json(capsys, "--preset", "search-3x-qwen2.5-3b", "--set", "placement.gpu_memory_gib=139.8")
    assert same_memory["estimate"]["hardware"] == "NVIDIA H100 SXM"  # an H200's memory does not make an H200


def test_sharding_and_checkpointing_shrink_the_planned_memory(capsys):
    base = ("--preset", "math-2x-qwen3-4b", "--json")
    fsdp = plan_json(capsys, *base[:2])["gpu_memory_gib"]["per_rank"][0]
    repl = plan_json(capsys, *base[:2], "--set", "placement.shared_pool.strategy=replicate")["gpu_memory_gib"][
        "per_rank"
    ][0]
    nock = plan_json(capsys, *base[:2], "--set", "learner.gradient_checkpointing=false")["gpu_memory_gib"]["per_rank"][
        0
    ]
    assert repl["optimizer"] == pytest.approx(4 * fsdp["optimizer"], rel=1e-3)
    assert nock["activations"] > 5 * fsdp["activations"]


def test_bad_override_is_a_config_error(capsys):
    assert main(["plan", "--offline", "--set", "placement.gpu_memory_gib=-1"]) == 2


@pytest.mark.parametrize("name", sorted(KNOWN_ARCHS))
def test_parameter_count_matches_transformers_model_of_that_config(name):
    a = KNOWN_ARCHS[name]
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[
        a.family
    ]
    cfg = cls(**a.hf_config_kwargs())  # the shape as the GPU check builds its model
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == a.n_params()


def test_smollm2_table_entry_equals_its_offline_config():
    folder = arch_from_folder(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"))
    table = KNOWN_ARCHS["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert {**folder.__dict__, "source": ""} == {**table.__dict__, "source": ""}


def test_fsdp_shards_the_state_but_not_the_activations():
    a = KNOWN_ARCHS["Qwen/Qwen3-4B"]
    one = train_state(a, dtype=4, tokens=8192, response_tokens=4096, checkpointing=True, chunk_mib=128)
    four = train_state(a, dtype=4, tokens=8192, response_tokens=4096, checkpointing=True, chunk_mib=128, shards=4)
    assert one.weights + one.gradients + one.optimizer == 16 * a.n_params()  # fp32 AdamW: 16 bytes a parameter
    assert four.optimizer * 4 == one.optimizer and four.activations == one.activations
    assert 59 < 16 * a.n_params() / GIB < 61  # benchmarks/results/scaling_notes.md: "64 GB per model"


def test_prompt_tokens_without_the_models_tokenizer_are_labelled_estimates(capsys, tmp_path):
    no_eval = ("--set", "eval.every=0", "--set", "eval.before_train=false")
    data = tmp_path / "problems.jsonl"  # a paper preset takes named data only: a small file of its own here
    data.write_text(
        "".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(8))
    )
    p = plan_json(capsys, "--preset", "math-2x-qwen3-4b", "--set", f"env.kwargs.dataset={data}", *no_eval)
    assert p["eval_dataset"] is None and p["train_dataset"]["size"] > 0
    assert p["prompt_tokens"]["status"].startswith("estimate") and p["prompt_tokens"]["per_agent"]
    assert all(r["unit"] == "tokens (estimate: characters / 4)" for r in p["prompt_tokens"]["per_agent"])


SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.mark.skipif(
    not (SHARED / "math" / "math500.jsonl").is_file(), reason="../shared/data/math/math500.jsonl absent"
)
def test_real_dataset_from_a_local_data_dir_gives_sizes_and_measured_prompts(capsys, monkeypatch):
    monkeypatch.setenv("DRMAS_DATA_DIR", str(SHARED))
    p = plan_json(
        capsys,
        "--preset", "math-2x-qwen3-4b",
        "--set", "env.kwargs.dataset=math500",
        "--set", "models.name=HuggingFaceTB/SmolLM2-135M-Instruct",
    )  # fmt: skip
    assert p["train_dataset"]["size"] == 500 and p["train_dataset"]["sources"] == {"math500": 500}
    assert p["steps_per_epoch"] == 15 and p["prompt_tokens"]["status"] == "measured"  # 500 // 32: whole batches
    first = next(r for r in p["prompt_tokens"]["per_agent"] if r["turn"] == "first")
    assert 50 < first["p50"] < first["max"] < 4096  # real MATH-500 problems vary in length


def test_a_rollout_pool_holds_the_engines_and_the_learner_pool_none(capsys):
    base = ("--preset", "math-2x-qwen3-4b")
    colocated = plan_json(capsys, *base)["gpu_memory_gib"]["per_rank"]
    split = ("--set", "placement.shared_pool.ranks=3", "--set", "placement.rollout_pool.gpus=1")
    split += ("--set", "models.engine.sleep=false")  # engines on GPUs of their own stay awake
    pooled = plan_json(capsys, *base, *split)["gpu_memory_gib"]["per_rank"]
    assert [r["pool"] for r in pooled] == ["shared", "rollout"]
    learner, rollout = pooled
    assert colocated[0]["engines"] > 0 and learner["engines"] == 0  # the learners hold no engine
    assert rollout["engines"] > 0 and rollout["weights"] == rollout["optimizer"] == rollout["activations"] == 0
    assert rollout["ranks"] == "0" and learner["optimizer"] > 0
    # With max_staleness >= 1 the rollout pool samples while the learners train: a step is the longer phase.
    async_ = ("--set", "rollout.max_staleness=1", "--set", "learner.old_logprobs=decoupled")
    est = plan_json(capsys, *base, *split, *async_)["estimate"]
    assert est["step_s"] == max(est["rollout_s_per_step"], est["learner_s_per_step"])
    assert est["gpus"] == 4


TODAY = {  # per-rank totals of the paper presets on 4-GPU pools, before offload, sleep or phases existed
    "math-2x-qwen3-4b": (98.18, 0.25),
    "search-3x-qwen2.5-7b": (144.87, 0.2),
    "search-3x-qwen2.5-3b": (74.23, 0.13),
    "search-shared-qwen2.5-7b": (86.40, 0.4),
    "search-heterogeneous": (120.27, 0.2),
}
FIELDS_OFF = (
    *("--set", "learner.optimizer_offload=false", "--set", "models.engine.sleep=false"),
    *("--set", "learner.residual_dtype=float32", "--set", "placement.shared_pool.ranks=4"),
)


@pytest.mark.parametrize("preset", sorted(TODAY))
def test_with_the_new_fields_off_the_plan_gives_the_old_figures(preset, capsys):
    total, share = TODAY[preset]  # the engines' old shares of the GPU (each engine resident beside the others)
    util = ("--set", f"models.engine.gpu_memory_utilization={share}")
    p = plan_json(capsys, "--preset", preset, *FIELDS_OFF, *util)
    assert p["gpu_memory_gib"]["per_rank"][0]["total"] == pytest.approx(total, abs=0.005)


@pytest.mark.parametrize("preset", PAPER)
def test_every_paper_preset_fits_80gb_at_the_reference_gpu_count_with_4_gib_headroom(preset, capsys):
    p = plan_json(capsys, "--preset", preset)
    m = p["gpu_memory_gib"]
    assert p["fits"] is True and m["fits"] is True and m["startup_fits"] is True, m
    assert m["declared"] == pytest.approx(79.6)
    for r in m["per_rank"]:
        assert r["capacity"] - max(r["total"], r["startup"]) >= 4.0, r
    assert m["host_per_node"]["fits"] is True
    assert p["estimate"]["gpus"] == (4 if preset in ("math-2x-qwen3-4b", "search-3x-qwen2.5-3b") else 8)
    assert p["reference"] and "README compute table" in p["reproduces"]


def _rank(capsys, *argv):
    return plan_json(capsys, "--preset", "math-2x-qwen3-4b", *FIELDS_OFF, *argv)["gpu_memory_gib"]["per_rank"][0]


def test_each_fields_saving_appears_only_in_the_phases_where_its_mechanism_frees_memory(capsys):
    off = _rank(capsys)
    parts = ("rollout_phase", "update_phase", "startup")

    def saved(r):
        return {k: round(off[k] - r[k], 2) for k in parts}

    # Offload: every model's AdamW state leaves the GPU while generating; in an update only the training
    # model's state is back; start-up builds no optimizer state.
    r = _rank(capsys, "--set", "learner.optimizer_offload=true")
    assert saved(r) == {
        "rollout_phase": round(off["optimizer"], 2),
        "update_phase": round(off["optimizer"] - r["optimizer_in_update"], 2),
        "startup": 0,
    }
    assert 0 < r["optimizer_in_update"] < off["optimizer"]  # two models: one model's state in its update
    # Sleep: one engine awake while generating, all asleep in updates, built one at a time at start-up.
    r = _rank(capsys, "--set", "models.engine.sleep=true")
    assert r["engines_rollout"] < r["engines"] and r["engines_update"] < r["engines_rollout"]
    assert saved(r) == {
        "rollout_phase": round(r["engines"] - r["engines_rollout"], 2),
        "update_phase": round(r["engines"] - r["engines_update"], 2),
        "startup": round(r["engines"] - r["engines_rollout"], 2),
    }
    # bf16 hidden states between layers: only the update's saved activations shrink.
    r = _rank(capsys, "--set", "learner.residual_dtype=compute")
    assert saved(r) == {
        "rollout_phase": 0,
        "update_phase": round(off["activations"] - r["activations"], 2),
        "startup": 0,
    }
    assert 0 < r["activations"] < off["activations"]


def test_offload_costs_host_memory_per_node(capsys):
    on = plan_json(capsys, "--preset", "search-3x-qwen2.5-3b", "--set", "learner.optimizer_offload=true")
    r_on = on["gpu_memory_gib"]["per_rank"][0]
    off = plan_json(capsys, "--preset", "search-3x-qwen2.5-3b", "--set", "learner.optimizer_offload=false")
    r_off = off["gpu_memory_gib"]["per_rank"][0]
    assert r_on["optimizer"] > 0 and r_on["host_steady"] == r_on["optimizer"] and r_off["host_steady"] == 0
    assert on["gpu_memory_gib"]["host_per_node"]["steady"] == pytest.approx(4 * r_on["optimizer"], abs=0.01)
    assert r_on["total"] == max(r_on["rollout_phase"], r_on["update_phase"])


def test_the_start_up_peak_reads_shards_under_fsdp_and_whole_models_when_replicated(capsys):
    args = ("--preset", "search-3x-qwen2.5-7b", "--set", "models.engine.sleep=false")
    p = plan_json(capsys, *args)
    rank = p["gpu_memory_gib"]["per_rank"][0]
    layer = max(m["layer_params"] for m in p["models"]) * 4 / 2**30
    assert rank["startup"] == pytest.approx(rank["weights"] + 3 * layer + rank["engines"] + rank["runtime"], abs=0.01)
    assert p["gpu_memory_gib"]["host_per_node"]["startup"] == pytest.approx(8 * layer, abs=0.01)
    whole = sum(m["params"] for m in p["models"]) * 4 / 2**30  # three fp32 7B models, unsharded
    rep = plan_json(capsys, *args, "--set", "placement.shared_pool.strategy=replicate")
    r = rep["gpu_memory_gib"]["per_rank"][0]
    assert r["startup"] == pytest.approx(whole + r["engines"] + r["runtime"], abs=0.01)
    assert (
        rep["gpu_memory_gib"]["startup_fits"] is False
        and "start-up needs" in rep["gpu_memory_gib"]["startup_problems"][0]
    )
    small = plan_json(
        capsys, *args, "--set", "placement.host_memory_gib=100", "--set", "learner.optimizer_offload=true"
    )
    assert small["gpu_memory_gib"]["host_per_node"]["fits"] is False
