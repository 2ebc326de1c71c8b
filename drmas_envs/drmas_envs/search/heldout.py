"""Held-out worlds: training on some generated worlds, validation and test on others (`world="held-out"`).

Every world is generated from its own seed, with the same generator, so what a team learns in the training
worlds must carry over to worlds whose every name is new. Names are built from invented parts, and each part
belongs to exactly one role (training, validation or test; by a hash of the part), so no held-out name, and
no part of one, ever occurs in a training world. Within a world:

- two passages per entity (a person's life and career, a city's overview and history, a company's overview
  and operations), each fact worded by one of several sentences (`drmas_envs.search.wordings`), the
  sentences shuffled, and other cities, years, people, countries, rivers, professions and industries
  mentioned beside the answer: the answer's type alone never picks it out of its passage;
- confusable names: people share given names and surnames, some cities are "Upper X" beside "X", companies
  are named after people and cities that have nothing to do with them;
- single-hop questions (one fact) in several phrasings, and two-hop questions ("Where was the founder of X
  born?") whose middle entity the question never names: the second search needs the first answer.

Held-out worlds also use wordings no training world has: each single-hop question there is `template` (a
training phrasing over a training sentence), `reworded-question` (a held-out phrasing) or
`reworded-passage` (its fact in a held-out sentence), each drawn with chance 1/3; two-hop questions draw on
all phrasings.
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from typing import Literal

from drmas_envs.search import wordings as W
from drmas_envs.search.world import SYLLABLES, World

WorldKind = Literal["classic", "held-out"]
"""`classic`: the one seed-0 world split by question (`drmas_envs.search.world`); `held-out`: this module."""

ROLES = ("train", "validation", "test")
"""Each role's worlds draw their names from their own third of the invented name parts."""

WORDINGS = ("template", "reworded-question", "reworded-passage")
"""How a held-out world words a single-hop question and its fact (see the module docstring)."""

SOURCES = ("world-single-hop", "world-two-hop", *(f"world-{w}" for w in WORDINGS))
"""Question sources: training worlds have `world-single-hop` and `world-two-hop`; held-out worlds split their
single-hop questions by wording (`world-template`, ...) and have `world-two-hop`."""

SIZES = {"country": 8, "river": 10, "city": 40, "person": 80, "company": 30}
"""Entities of each kind per world."""

_PROFESSIONS = ("painter", "engineer", "poet", "astronomer", "architect", "composer", "botanist", "sculptor")
_INDUSTRIES = ("shipbuilding", "textiles", "glassmaking", "publishing", "brewing", "mining", "clockmaking")
_LANDMARKS = ("stone bridge", "clock tower", "harbour", "old library", "salt market", "hill fortress")
LAST_YEAR = 2024
"""No year in a passage lies after it (a year in the future would give a distractor away); see `_Writer.slots`."""
_PREFIXES = ("Upper", "Lower", "New", "Old", "Port")
_SUBJECTS = {"person": ("{name}", "{name}", "{surname}"), "city": ("{name}", "{name}", "the city", "the town"),
             "company": ("{name}", "{name}", "the company", "the firm")}  # fmt: skip
PASSAGES = {
    "person": (("{name}", ("person_birthplace", "person_birth_year"), ("moved", "relative", "family")),
               ("{name} (career)", ("person_profession",), ("mentor", "workplace"))),
    "city": (("{name}", ("city_country", "city_river"), ("twin", "canal", "inhabitants")),
             ("History of {name}", ("city_founded",), ("landmark", "merchants", "settled"))),
    "company": (("{name}", ("company_founder", "company_founded", "company_industry"),
                 ("chair", "sideline", "staff", "workshop")),
                ("{name} (operations)", ("company_hq",), ("plant", "rival"))),
}  # fmt: skip
"""Entity kind -> its passages: (title, fact types, distractor kinds)."""

FACT_TYPE = {"city_country": "country", "city_river": "river", "city_founded": "year", "person_birthplace": "city",
             "person_birth_year": "year", "person_profession": "prof", "company_founder": "person",
             "company_founded": "year", "company_industry": "industry", "company_hq": "city"}  # fmt: skip
"""Fact type -> the type of its answer (a key of `ANSWER_TYPES`)."""

ANSWER_TYPES = ("city", "person", "company", "country", "river", "prof", "industry")
"""The named answer types (`World.entities`); years are the other one."""

RELATION = {"city_country": "country", "city_river": "river", "city_founded": "founded", "company_founded": "founded",
            "person_birthplace": "birthplace", "person_birth_year": "birth_year", "person_profession": "profession",
            "company_founder": "founder", "company_industry": "industry", "company_hq": "hq"}  # fmt: skip
"""Fact type -> the question relation that asks for it (`wordings.FRAMES`)."""

_CITY_FACTS = ("city_country", "city_river", "city_founded")
TWO_HOP = {
    "person": (("person_birthplace", "city", _CITY_FACTS),),
    "company": (
        ("company_hq", "city", _CITY_FACTS),
        ("company_founder", "person", ("person_birthplace", "person_birth_year", "person_profession")),
    ),
}
"""Entity kind -> (first fact, the kind it leads to, the facts asked of that entity)."""


class _Names:
    """Invented name parts of one role: unique within the world, each in its role's third of all parts."""

    def __init__(self, rng: random.Random, role: str):
        self.rng, self.role, self.used = rng, ROLES.index(role), set()

    def __call__(self, syllables: int) -> str:
        while True:
            part = "".join(self.rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()
            if part not in self.used and len(part) > 3 and part_role(part) == self.role:
                self.used.add(part)
                return part


def part_role(part: str) -> int:
    """The index in `ROLES` of the worlds that may use an invented name part."""
    return zlib.crc32(part.lower().encode()) % len(ROLES)


def _places(rng: random.Random, name: _Names) -> tuple[list[str], list[str], list[dict]]:
    countries = [name(3) for _ in range(SIZES["country"])]
    rivers = [name(2) for _ in range(SIZES["river"])]
    n = SIZES["city"]
    stems = [name(3) for _ in range(n - n // 4)]
    names = stems + [f"{rng.choice(_PREFIXES)} {s}" for s in rng.sample(stems, n // 4)]  # "Upper X" beside "X"
    cities = [
        {"name": c, "country": rng.choice(countries), "river": rng.choice(rivers),
         "founded": rng.randint(1100, 1850), "landmark": rng.choice(_LANDMARKS)}
        for c in names
    ]  # fmt: skip
    return countries, rivers, cities


def _people(rng: random.Random, name: _Names, cities: list[dict]) -> list[dict]:
    n = SIZES["person"]
    given, family = [name(2) for _ in range(n // 2)], [name(2) for _ in range(n // 2)]  # shared name parts
    pairs = list(dict.fromkeys((rng.choice(given), rng.choice(family)) for _ in range(4 * n)))[:n]
    return [
        {"name": f"{g} {f}", "surname": f, "birthplace": rng.choice(cities)["name"],
         "birth_year": rng.randint(1800, 1940), "profession": rng.choice(_PROFESSIONS)}
        for g, f in pairs
    ]  # fmt: skip


def _companies(rng: random.Random, name: _Names, cities: list[dict], people: list[dict]) -> list[dict]:
    parts = [p["surname"] for p in people] + [c["name"] for c in cities if " " not in c["name"]]
    companies, taken = [], set()
    while len(companies) < SIZES["company"]:
        founder, hq = rng.choice(people), rng.choice(cities)
        stem = rng.choice([rng.choice(parts), name(2)])  # named after someone or somewhere unrelated, or new
        given_away = (founder["name"], hq["name"], founder["birthplace"])  # what its questions ask
        if stem in taken or any(stem in n.split() for n in given_away):
            continue  # the name never gives away an answer
        taken.add(stem)
        companies.append(
            {"name": f"{stem} Works", "founder": founder["name"], "hq": hq["name"],
             "founded": founder["birth_year"] + rng.randint(20, 50), "industry": rng.choice(_INDUSTRIES)}
        )  # fmt: skip
    return companies


def _entities(rng: random.Random, role: str) -> dict[str, list]:
    name = _Names(rng, role)
    countries, rivers, cities = _places(rng, name)
    people = _people(rng, name, cities)
    return {"country": countries, "river": rivers, "city": cities, "person": people,
            "company": _companies(rng, name, cities, people)}  # fmt: skip


def fact_values(kind: str, entity: dict) -> dict[str, str]:
    """Fact type -> answer, for one entity of `kind`."""
    keys = {"city": ("country", "river", "founded"), "person": ("birthplace", "birth_year", "profession"),
            "company": ("founder", "founded", "industry", "hq")}[kind]  # fmt: skip
    return {f"{kind}_{k}": str(entity[k]) for k in keys}


def _base_year(kind: str, entity: dict) -> int:
    return entity["birth_year" if kind == "person" else "founded"]


def _later(rng: random.Random, year: int, low: int, high: int) -> int:
    """A year `low` to `high` years after `year`, not after `LAST_YEAR` (the latest founding allows `low`)."""
    return year + rng.randint(low, max(low, min(high, LAST_YEAR - year)))


def _sentence(template: str, slots: dict[str, str]) -> str:
    text = re.sub(r"\b([Aa]) ([aeiou])", r"\1n \2", template.format(**slots))
    return text[0].upper() + text[1:]


class _Writer:
    """Writes one world's passages: facts in their chosen wordings, distractors around them."""

    def __init__(self, rng: random.Random, pools: dict[str, list[str]]):
        self.rng, self.pools = rng, pools

    def other(self, kind: str, avoid: set[str]) -> str:
        return self.rng.choice([v for v in self.pools[kind] if v not in avoid])

    def slots(self, kind: str, entity: dict, avoid: set[str]) -> dict[str, str]:
        """Fresh distractors for one sentence: other entities, a later and an earlier year, a count."""
        rng, base = self.rng, _base_year(kind, entity)
        out = {t: self.other(t, avoid) for t in ANSWER_TYPES}
        years = {"year": str(_later(rng, base, 5, 70)), "early": str(base - rng.randint(5, 70))}
        return out | years | {"n": str(rng.randint(300, 60000)), "landmark": entity.get("landmark", ""), "s": "{s}"}

    def passage(self, kind: str, entity: dict, facts: tuple[str, ...], distractors: tuple[str, ...], held: set) -> str:
        """The passage's sentences, shuffled; the facts in `held` in a held-out wording."""
        rng, values = self.rng, fact_values(kind, entity)
        avoid = {entity["name"], *values.values()}
        sentences = []
        for fact in facts:
            a, kind_a = values[fact], FACT_TYPE[fact]
            x = str(_later(rng, int(a), 2, 60)) if kind_a == "year" else self.other(kind_a, avoid)
            template = rng.choice(W.FACTS[fact][fact in held])
            sentences.append(_sentence(template, {**self.slots(kind, entity, avoid), "a": a, "x": x}))
        sentences += [_sentence(rng.choice(W.DISTRACTORS[d]), self.slots(kind, entity, avoid)) for d in distractors]
        rng.shuffle(sentences)
        refs = [s.format(**entity) for s in _SUBJECTS[kind]]
        out, named = [], False
        for s in sentences:  # the first mention is the full name, later ones vary
            ref = rng.choice(refs) if named else entity["name"]
            named = named or "{s}" in s
            out.append(_sentence(s, {"s": ref}))
        return " ".join(out)


def _question(frame: str, e: str) -> str:
    text = frame.format(e=e)
    return text[0].upper() + text[1:]


def _pick(rng: random.Random, pool: W.Pool, which: str) -> str:
    """A wording of `pool`: "train" (training), "held" (held-out) or "any"."""
    return rng.choice({"train": pool[0], "held": pool[1], "any": pool[0] + pool[1]}[which])


def _wordings(rng: random.Random, kind: str, entity: dict, held_out: bool) -> dict[str, str]:
    """Fact type -> how its single-hop question and sentence are worded (`WORDINGS`; training worlds: template)."""
    return {f: rng.choice(WORDINGS) if held_out else "template" for f in fact_values(kind, entity)}


def _single(
    rng: random.Random, kind: str, entity: dict, wording: dict[str, str], titles: dict, held_out: bool
) -> list[dict]:
    """One question per fact of the entity, phrased as its wording says."""
    out = []
    for fact, answer in fact_values(kind, entity).items():
        frame = _pick(rng, W.FRAMES[RELATION[fact]], "held" if wording[fact] == "reworded-question" else "train")
        source = f"world-{wording[fact]}" if held_out else "world-single-hop"
        name = entity["name"]
        out.append(
            {
                "question": _question(frame, name),
                "golden_answers": [answer],
                "source": source,
                "supporting_titles": [titles[name, fact]],
                "hops": 1,
                "relation": RELATION[fact],
                "entity": name,
            }
        )
    return out


def _two_hop(
    rng: random.Random, kind: str, entity: dict, ents: dict[str, list], titles: dict, held_out: bool
) -> list[dict]:
    """Questions about the entity a fact of this one leads to, described, never named."""
    out, which = [], "any" if held_out else "train"
    for first, target, finals in TWO_HOP.get(kind, ()):
        bridge = next(b for b in ents[target] if b["name"] == fact_values(kind, entity)[first])
        for final in finals:
            descriptor = _pick(rng, W.BRIDGES[RELATION[first]], which).format(e=entity["name"])
            question = _question(_pick(rng, W.FRAMES[RELATION[final]], which), descriptor)
            titles_ = [titles[entity["name"], first], titles[bridge["name"], final]]
            out.append({"question": question, "golden_answers": [fact_values(target, bridge)[final]],
                        "source": "world-two-hop", "supporting_titles": titles_, "hops": 2,
                        "relation": f"{RELATION[first]}>{RELATION[final]}", "entity": entity["name"],
                        "bridge": bridge["name"]})  # fmt: skip
    return out


@functools.cache
def heldout_world(key: str) -> World:
    """The world `key`: "train-<i>", "validation-<i>" or "test-<i>" (cached; a pure function of the key)."""
    role, _, index = key.rpartition("-")
    if role not in ROLES or not index.isdigit():
        raise ValueError(f"a held-out world key is <role>-<index> with role in {ROLES}, not {key!r}")
    rng, held_out = random.Random(f"drmas-search-world-{key}"), role != "train"
    ents = _entities(rng, role)
    pools = {
        k: [e if isinstance(e, str) else e["name"] for e in ents[k]]
        for k in ("country", "river", "city", "person", "company")
    }
    pools |= {"prof": list(_PROFESSIONS), "industry": list(_INDUSTRIES)}
    writer, passages, titles, wording = _Writer(rng, pools), [], {}, {}
    for kind in ("city", "person", "company"):
        for e in ents[kind]:
            wording[e["name"]] = _wordings(rng, kind, e, held_out)
            held = {f for f, w in wording[e["name"]].items() if w == "reworded-passage"}
            for title_format, facts, distractors in PASSAGES[kind]:
                title = title_format.format(name=e["name"])
                passages.append((f"{key}/{len(passages)}", title, writer.passage(kind, e, facts, distractors, held)))
                titles.update({(e["name"], f): title for f in facts})
    raw = []
    for kind in ("city", "person", "company"):
        for e in ents[kind]:
            raw += _single(rng, kind, e, wording[e["name"]], titles, held_out)
            raw += _two_hop(rng, kind, e, ents, titles, held_out)
    rng.shuffle(raw)
    questions = tuple({"id": f"{key}-{i}", **q, "split": role, "world": key} for i, q in enumerate(raw))
    return World(tuple(passages), questions, {k: tuple(v) for k, v in pools.items()})


def world_keys(split: str, train_worlds: int) -> list[str]:
    """The worlds of a split: "train" (the first `train_worlds`), "validation", "test" (one each) or "all"."""
    keys = {"train": [f"train-{i}" for i in range(train_worlds)], "validation": ["validation-0"], "test": ["test-0"]}
    if split == "all":
        return [k for role in ROLES for k in keys[role]]
    if split not in keys:
        raise ValueError(f"the held-out worlds have splits 'train', 'validation', 'test' and 'all', not {split!r}")
    return keys[split]


def heldout_questions(split: str, train_worlds: int) -> list[dict]:
    """The questions of a split's worlds, world by world."""
    return [q for key in world_keys(split, train_worlds) for q in heldout_world(key).questions]
