"""The benchmark scripts of drmas, one module each: `python -m drmas_benchmarks.<name> --help`.

Their recorded results live beside the package, in benchmarks/results/.
"""
