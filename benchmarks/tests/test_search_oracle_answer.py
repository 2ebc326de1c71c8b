"""The reading check's scripted Search agent: it searches the gold chain, so every Answer prompt shows the
question's supporting passages; with the model searching, the share says how often its searches found them."""

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

import drmas_envs
from drmas_benchmarks.search_oracle_answer import ENV, make_policy, measure, scripted_search
from drmas_train.engines.transformers_backend import TransformersBackend
from drmas_train.testing.tiny import build_tiny_model


def tiny_engine(tmp_path) -> TransformersBackend:
    folder = build_tiny_model(tmp_path / "tiny", arch="llama", seed=0)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    return TransformersBackend(model, AutoTokenizer.from_pretrained(folder))


def test_the_scripted_chain_shows_every_supporting_passage_and_the_model_is_measured(tmp_path):
    engine = tiny_engine(tmp_path)
    env_kwargs = {**ENV, "split": "validation", "hops": [2]}
    tasks = {t["question"]: t for t in drmas_envs.make("search-2agent", **env_kwargs).unwrapped.tasks}
    q = next(iter(tasks.values()))
    first = f"Question: {q['question']}\n\nSearch history:\n(no searches yet)\n\nWrite the next search query."
    assert scripted_search(tasks, first) == f"{q['entity']}</search>"
    step = f"Step 1: <search>{q['entity']}</search>\n<information>Doc 1(Title: T) x</information>"
    later = first.replace("(no searches yet)", step)
    assert scripted_search(tasks, later) == f"{q['bridge']}</search>"
    found = {}
    for search in ("gold", "model"):
        shown: list[bool] = []
        policy = make_policy(engine, tasks, shown, search=search, temperature=0.0, seed=0)
        drmas_envs.evaluate(policy, "search-2agent", k=1, n_problems=8, **env_kwargs)
        assert len(shown) == 8
        found[search] = sum(shown)
    # Not every gold chain shows both passages: a middle entity's search can rank its confusable namesakes
    # ("Port X", "History of X") above its own passage. Random weights find none.
    assert found["gold"] >= 4 and found["model"] == 0, found


def test_a_prompts_file_is_what_the_answer_agent_reads_and_k_0_measures_greedy_only(tmp_path):
    prompts = tmp_path / "answer.json"
    system = "MARKER: answer with a name copied from the documents, inside <answer>...</answer>."
    user = "Question: {question}\n\nSearch history:\n{history}\n\nQuestion again: {question}"
    prompts.write_text(json.dumps({"answer": {"system": system, "user": user}}))
    out = measure(tiny_engine(tmp_path), n=3, k=0, prompts_file=str(prompts))
    assert sorted(out) == ["hops1/greedy", "hops2/greedy"]
    for entry in out.values():
        shown = entry["first_answer_prompt"]
        assert shown["system"] == system and "Question again: " in shown["user"]
