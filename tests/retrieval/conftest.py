import sys
from pathlib import Path

# the toy corpus helpers live beside the env tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
