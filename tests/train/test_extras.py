"""drmas-train's extras: the core never imports them; a missing one is an error naming its extra."""

import subprocess
import sys

import pytest

from drmas_train.engines.extras import MissingExtraError, require
from drmas_train.engines.resolve import convert_gguf


def test_the_core_imports_neither_gguf_nor_matplotlib():
    code = (
        "import sys, drmas_train.cli, drmas_train.run.trainer, drmas_train.cli.eval, drmas_train.engines.resolve; "
        "print(sorted(m for m in ('gguf', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_require_passes_for_an_installed_module_and_names_the_extra_otherwise():
    require("json", "bench", "anything")
    with pytest.raises(MissingExtraError, match=r"plotting needs the `no_such_mod` package.*drmas-train\[bench\]"):
        require("no_such_mod", "bench", "plotting")


def test_converting_the_gguf_without_its_reader_names_the_offline_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an environment without the package looks like
    with pytest.raises(MissingExtraError, match=r"pip install 'drmas-train\[offline\]'"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_benchmark_plot_without_matplotlib_names_the_bench_extra(tmp_path):
    code = (
        "import runpy, sys; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['plot_run.py', {str(tmp_path)!r}]; "
        "runpy.run_module('drmas_benchmarks.plot_run', run_name='__main__')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "MissingExtraError" in out.stderr and "pip install 'drmas-train[bench]'" in out.stderr
