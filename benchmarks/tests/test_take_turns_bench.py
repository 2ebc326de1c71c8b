"""drmas_benchmarks.take_turns: two real processes run one at a time, and each one's running time is counted."""

import sys

from drmas_benchmarks import take_turns as bench

# Stamps the shared monotonic clock every 10 ms into a file until it has had `cpu` seconds of CPU.
WORKER = (
    "import sys, time\n"
    "out, cpu = open(sys.argv[1], 'w'), float(sys.argv[2])\n"
    "while time.process_time() < cpu:\n"
    "    t = time.monotonic()\n"
    "    while time.monotonic() - t < 0.01: pass\n"
    "    out.write(f'{time.monotonic()}\\n'); out.flush()\n"
)


def test_two_commands_take_turns_and_each_gets_its_running_time(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    commands = [f"{sys.executable} {script} {tmp_path / name} 1.0" for name in ("a", "b")]
    turns = bench.take_turns(["a", "b"], commands, slice_s=0.4)
    assert [t.returncode for t in turns] == [0, 0]
    for turn in turns:
        # a second of CPU (plus the interpreter's start) in its own slices, several of them
        assert turn.active_s >= 1.0 and turn.slices >= 3, turn
    stamps = sorted(
        [(float(x), "a") for x in (tmp_path / "a").read_text().split()]
        + [(float(x), "b") for x in (tmp_path / "b").read_text().split()]
    )
    blocks = 1 + sum(1 for (_, p), (_, q) in zip(stamps, stamps[1:]) if p != q)
    # one at a time: the stamps form a few long blocks, one per slice, not an a/b alternation every 10 ms
    assert 3 <= blocks <= sum(t.slices for t in turns) + 1, blocks
    assert len(stamps) > 10 * blocks
