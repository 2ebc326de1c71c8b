"""docs/paper_runs.md works in order: everything a run needs is downloaded before the guide goes offline,
the gated model is announced with `hf auth login`, no step reads a path that no earlier step wrote, and no
page names the retired `huggingface-cli`."""

import re
from pathlib import Path

from drmas_train.config import list_presets, load_preset

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "paper_runs.md"
GATED = ("meta-llama/",)
"""Hub owners whose models need an accepted licence and a token."""
ENCODER = "intfloat/e5-base-v2"


def _commands() -> list[str]:
    """The guide's shell lines in order (code blocks only, continuation lines joined, comments cut), each
    `for VAR in ...; do` body expanded once per value."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)
    raw = "\n".join(blocks).replace("\\\n", " ").splitlines()
    lines = [line.split(" #")[0].strip() for line in raw if line.strip() and not line.lstrip().startswith("#")]
    out: list[str] = []
    loop: tuple[str, list[str]] | None = None
    for line in lines:
        found = re.match(r"for (\w+) in (.*?); do$", line)
        if found:
            loop = (found.group(1), found.group(2).split())
        elif line == "done":
            loop = None
        elif loop is not None:
            var, values = loop
            out += [line.replace(f'"${var}"', v).replace(f"${var}", v) for v in values]
        else:
            out.append(line)
    return out


def _paper_models() -> set[str]:
    models = set()
    for name in list_presets():
        data = load_preset(name)
        if "reference" in data:
            models.add(data["models"]["name"])
            models.update((data["models"].get("per_agent_names") or {}).values())
    return models


def _downloaded_before_offline() -> tuple[set[str], list[str]]:
    """Every hub id an `hf download` line fetches before `HF_HUB_OFFLINE=1`, and the lines before it."""
    lines = _commands()
    offline = next(i for i, line in enumerate(lines) if "HF_HUB_OFFLINE=1" in line)
    ids = {line.split()[2] for line in lines[:offline] if line.startswith("hf download")}
    return ids, lines[:offline]


def test_every_paper_model_and_the_encoder_is_downloaded_before_the_guide_goes_offline():
    ids, _ = _downloaded_before_offline()
    missing = (_paper_models() | {ENCODER}) - ids
    assert not missing, f"not downloaded before HF_HUB_OFFLINE: {sorted(missing)}"


def test_the_gated_model_is_announced_and_logged_in_for_before_its_download():
    _, before = _downloaded_before_offline()
    gated = sorted(m for m in _paper_models() if m.startswith(GATED))
    assert gated, "a paper preset uses a gated model; the test must see it"
    text = GUIDE.read_text()
    for model in gated:
        assert f"`{model}`" in text and "gated" in text
    first_download = next(i for i, line in enumerate(before) if line.startswith("hf download"))
    assert any(line.startswith("hf auth login") for line in before[:first_download])


def test_no_step_reads_a_path_no_earlier_step_wrote():
    written: set[str] = set()
    reads = ("--vectors", "--corpus", "--index", "--checkpoint")
    writes = ("--local-dir", "--out", "--run-dir")
    for line in _commands():
        words = line.split()
        for flag, value in zip(words, words[1:]):
            if flag in reads:
                assert any(value.startswith(w) for w in written), f"{line!r} reads {value}, written by no earlier step"
        for flag, value in zip(words, words[1:]):
            if flag in writes:
                written.add(value.rstrip("/"))
        if ">" in words:
            written.add(words[words.index(">") + 1])
        if words[:2] == ["drmas-train", "--preset"]:  # a run writes runs/<preset>
            written.add(f"runs/{words[2]}")
        if words[:2] == ["drmas-train", "export"]:
            assert any(words[2].startswith(w) for w in written), f"{line!r} exports a run no step trained"


def test_no_page_names_huggingface_cli():
    pages = [*ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md", ROOT / "retrieval" / "README.md"]
    assert not [p.name for p in pages if "huggingface-cli" in p.read_text()]
