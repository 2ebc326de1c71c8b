"""drmas_benchmarks.learner_precision: a setting names the learner fields it changes, and nothing else."""

import pytest

from drmas_benchmarks import learner_precision as bench
from drmas_train.config import build_config


@pytest.mark.parametrize(
    ("setting", "want"),
    [
        ("float32", dict(compute_dtype="float32", compile_layers=False, head_dtype="float32")),
        ("bfloat16+compile", dict(compute_dtype="bfloat16", compile_layers=True, head_dtype="float32")),
        ("bfloat16+head+mb12", dict(compute_dtype="bfloat16", head_dtype="compute", micro_batch_size=12)),
        ("bfloat16+mb8", dict(compute_dtype="bfloat16", head_dtype="float32", micro_batch_size=8)),
    ],
)
def test_a_setting_changes_the_fields_it_names(setting, want):
    base = build_config("cpu").learner
    cfg = bench._setting(base, setting)
    assert {k: getattr(cfg, k) for k in want} == want
    assert cfg.lr == base.lr and cfg.tree_multiple == base.tree_multiple
    if "mb" not in setting:
        assert cfg.micro_batch_size == base.micro_batch_size


@pytest.mark.parametrize("setting", ["bfloat16+fast", "float32+mb", "bfloat16+mbx"])
def test_an_unknown_setting_is_refused(setting):
    with pytest.raises(SystemExit, match="DTYPE"):
        bench._setting(build_config("cpu").learner, setting)
