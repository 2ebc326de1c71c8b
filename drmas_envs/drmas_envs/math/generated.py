r"""The embedded default dataset: arithmetic and word problems of graded difficulty, generated.

No download. Deterministic from (seed, split, level). Each level is its own `source`
("generated/L1" ... "generated/L5"), so `evaluate(...)["by_source"]` reports the tiers apart.

- L1: single-digit addition and subtraction with a single-digit, non-negative result ("What is 3 + 4?"),
  half of them as one-sentence word problems. The tier a 135M model can actually solve.
- L2: single-digit operands, +, - and x, results up to 81; bare and word problems.
- L3: two-digit addition and subtraction, two-digit times one-digit; bare and word problems.
- L4: two operations on two-digit numbers, with order of operations; two-step word problems.
- L5: fractions (answer in lowest terms, e.g. \frac{11}{12}), three-digit by two-digit products, exact division.

Test items never repeat a train item of the same level; small levels may therefore have fewer
test items than asked for.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from fractions import Fraction

LEVELS = (1, 2, 3, 4, 5)
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "coins", "cookies", "shells", "cards", "stamps")

Problem = tuple[str, str]  # (problem text, answer)


def _add_sub(rng: random.Random, lo: int, hi: int, result_max: int | None) -> tuple[int, str, int, int]:
    while True:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        op = rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        value = a + b if op == "+" else a - b
        if result_max is None or value <= result_max:
            return a, op, b, value


def _story(rng: random.Random, a: int, op: str, b: int) -> str:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if op == "+":
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
    if op == "-":
        return f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"
    return f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have?"


def _bare_or_story(rng: random.Random, a: int, op: str, b: int, value: int) -> Problem:
    if rng.random() < 0.5:
        sym = {"+": "+", "-": "-", "*": "\\times"}[op]
        return f"What is ${a} {sym} {b}$?", str(value)
    return _story(rng, a, op, b), str(value)


def level1(rng: random.Random) -> Problem:
    a, op, b, value = _add_sub(rng, 0, 9, result_max=9)
    return _bare_or_story(rng, a, op, b, value)


def level2(rng: random.Random) -> Problem:
    if rng.random() < 1 / 3:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return _bare_or_story(rng, a, "*", b, a * b)
    a, op, b, value = _add_sub(rng, 1, 9, result_max=None)
    return _bare_or_story(rng, a, op, b, value)


def level3(rng: random.Random) -> Problem:
    if rng.random() < 1 / 3:
        a, b = rng.randint(11, 99), rng.randint(2, 9)
        return _bare_or_story(rng, b, "*", a, a * b)
    a, op, b, value = _add_sub(rng, 10, 99, result_max=None)
    return _bare_or_story(rng, a, op, b, value)


def level4(rng: random.Random) -> Problem:
    a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
    form = rng.randrange(3)
    if form == 0:
        return f"What is ${a} + {b} \\times {c}$?", str(a + b * c)
    if form == 1:
        return f"What is $({a} + {b}) \\times {c}$?", str((a + b) * c)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = a + b
    return (
        f"{name} has {a} {item} and buys {b} more. {name} then puts them into {c} boxes, the same number "
        f"in each box, and keeps the {total % c} left over. How many {item} are in each box?",
        str(total // c),
    )


def _frac(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    sign = "-" if x < 0 else ""
    return f"{sign}\\frac{{{abs(x.numerator)}}}{{{x.denominator}}}"


def level5(rng: random.Random) -> Problem:
    form = rng.randrange(3)
    if form == 0:
        (xn, xd), (yn, yd) = [(rng.randint(1, 9), rng.randint(2, 12)) for _ in range(2)]
        op = rng.choice("+-")
        value = Fraction(xn, xd) + (Fraction(yn, yd) if op == "+" else -Fraction(yn, yd))
        return (
            f"What is $\\frac{{{xn}}}{{{xd}}} {op} \\frac{{{yn}}}{{{yd}}}$? "
            "Give the answer as a fraction in lowest terms.",
            _frac(value),
        )
    if form == 1:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        return f"What is ${a} \\times {b}$?", str(a * b)
    q, d = rng.randint(12, 99), rng.randint(3, 19)
    return f"What is ${q * d} \\div {d}$?", str(q)


GENERATORS: dict[int, Callable[[random.Random], Problem]] = {1: level1, 2: level2, 3: level3, 4: level4, 5: level5}


def _draw(level: int, seed: int, stream: str, n: int, exclude: frozenset[str]) -> list[Problem]:
    # str seeds hash deterministically (sha512), unlike hash() of a tuple.
    rng = random.Random(f"drmas-math-{seed}-{stream}-L{level}")
    seen: set[str] = set()
    out: list[Problem] = []
    for _ in range(n * 20):  # bounded: small levels run out of distinct problems
        problem, answer = GENERATORS[level](rng)
        if problem in seen or problem in exclude:
            continue
        seen.add(problem)
        out.append((problem, answer))
        if len(out) == n:
            break
    return out


@functools.lru_cache(maxsize=32)
def _level_items(level: int, n: int, seed: int, split: str) -> tuple[dict, ...]:
    train = _draw(level, seed, "train", n, frozenset())
    items = train if split == "train" else _draw(level, seed, "test", n, frozenset(p for p, _ in train))
    source = f"generated/L{level}"
    return tuple(
        {"id": f"gen-{split}-L{level}-{i}", "problem": p, "answer": a, "source": source, "level": level}
        for i, (p, a) in enumerate(items)
    )


def generate(levels: int | Iterable[int] = (1, 2, 3), n_per_level: int = 1000, seed: int = 0, split: str = "train"):
    """The generated problems of `levels` (each a task dict with problem, answer, id, source, level).

    Args:
        levels: one level 1-5 or several.
        n_per_level: problems per level (fewer when a level has fewer distinct problems).
        seed: the generation seed; the same seed gives the same problems.
        split: "train" or "test" (disjoint from train within each level).

    """
    levels = (levels,) if isinstance(levels, int) else tuple(levels)
    bad = [lv for lv in levels if lv not in GENERATORS]
    if bad or not levels:
        raise ValueError(f"levels must be among {LEVELS}, got {levels}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test' for the generated set, got {split!r}")
    if n_per_level < 1:
        raise ValueError("n_per_level must be at least 1")
    return tuple(t for lv in levels for t in _level_items(lv, n_per_level, seed, split))
