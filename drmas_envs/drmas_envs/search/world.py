"""The embedded default: a generated fictional world (corpus + single- and multi-hop questions).

Every name is invented, so a model cannot know the answers: they are only in the corpus. One
passage describes one entity; a multi-hop question chains two passages (a person's birthplace,
then that city's country). Everything is a pure function of the seed.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

SYLLABLES = (
    "ka ra lo mi ven dor tal ne sha bri gan mor li the ush val ke do ran sel fa zu or pen wi ta "
    "lan ric el gor ha ber nim os tu quen dra fel ir mo sa len vik ash tor"
).split()
_PROFESSIONS = ("painter", "engineer", "poet", "astronomer", "architect", "composer", "botanist", "sculptor")
_INDUSTRIES = ("shipbuilding", "textile", "glassmaking", "publishing", "brewing", "mining", "clockmaking")
_LANDMARKS = ("stone bridge", "clock tower", "harbour", "old library", "salt market", "hill fortress")


@dataclass(frozen=True)
class World:
    """A generated corpus and question set.

    Attributes:
        passages: (id, title, text) records.
        questions: items with `id`, `question`, `golden_answers`, `source` ("world-single-hop" or
            "world-multi-hop"), `supporting_titles`, `split` ("train" or "test") and `hops` (1 or 2).

    """

    passages: tuple[tuple[str, str, str], ...]
    questions: tuple[dict, ...]
    entities: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Answer type -> the world's names of that type (the held-out worlds fill it; `heldout.ANSWER_TYPES`)."""


class _Names:
    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def __call__(self, syllables: int) -> str:
        while True:
            name = "".join(self.rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()
            if name not in self.used and len(name) > 3:
                self.used.add(name)
                return name


def _entities(rng: random.Random, n_countries: int, n_cities: int, n_people: int, n_companies: int):
    name = _Names(rng)
    countries = [name(3) for _ in range(n_countries)]
    rivers = [name(2) for _ in range(n_countries * 2)]
    cities = [
        {"name": name(3), "country": rng.choice(countries), "river": rng.choice(rivers),
         "year": rng.randint(900, 1850), "landmark": rng.choice(_LANDMARKS)}
        for _ in range(n_cities)
    ]  # fmt: skip
    people = [
        {"name": f"{name(2)} {name(2)}", "city": rng.choice(cities)["name"], "year": rng.randint(1800, 1990),
         "profession": rng.choice(_PROFESSIONS)}
        for _ in range(n_people)
    ]  # fmt: skip
    companies = [
        {"name": f"{name(2)} Works", "founder": rng.choice(people)["name"], "city": rng.choice(cities)["name"],
         "year": rng.randint(1850, 2000), "industry": rng.choice(_INDUSTRIES)}
        for _ in range(n_companies)
    ]  # fmt: skip
    return cities, people, companies


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _city_text(c: dict) -> str:
    return (
        f"{c['name']} is a city in {c['country']}. It lies on the {c['river']} river and was founded in "
        f"{c['year']}. The city is known for its {c['landmark']}."
    )


def _person_text(p: dict) -> str:
    job = p["profession"]
    return (
        f"{p['name']} (born {p['year']} in {p['city']}) is {_article(job)} {job}. "
        f"{p['name'].split()[0]} spent most of a long career working in {p['city']}."
    )


def _company_text(m: dict) -> str:
    kind = m["industry"]
    return (
        f"{m['name']} is {_article(kind)} {kind} company founded in {m['year']} by {m['founder']}. "
        f"Its headquarters are in {m['city']}."
    )


def _passages(cities, people, companies) -> list[tuple[str, str, str]]:
    out = [(c["name"], _city_text(c)) for c in cities]
    out += [(p["name"], _person_text(p)) for p in people]
    out += [(m["name"], _company_text(m)) for m in companies]
    return [(f"w{i}", title, text) for i, (title, text) in enumerate(out)]


def _questions(cities, people, companies) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(question, answer, kind, supporting titles)."""
    city = {c["name"]: c for c in cities}
    person = {p["name"]: p for p in people}
    qs = []
    for c in cities:
        n = c["name"]
        qs += [
            (f"In which year was the city of {n} founded?", str(c["year"]), "single", (n,)),
            (f"On which river does {n} lie?", c["river"], "single", (n,)),
            (f"In which country is {n}?", c["country"], "single", (n,)),
        ]
    for p in people:
        n, home = p["name"], city[p["city"]]
        qs += [
            (f"Where was {n} born?", p["city"], "single", (n,)),
            (f"What is the profession of {n}?", p["profession"], "single", (n,)),
            (f"In which country was {n} born?", home["country"], "multi", (n, home["name"])),
            (f"On which river lies the home city of {n}?", home["river"], "multi", (n, home["name"])),
        ]
    for m in companies:
        n, founder, hq = m["name"], person[m["founder"]], city[m["city"]]
        qs += [
            (f"Who founded {n}?", m["founder"], "single", (n,)),
            (f"In which city are the headquarters of {n}?", m["city"], "single", (n,)),
            (f"Where was the founder of {n} born?", founder["city"], "multi", (n, founder["name"])),
            (f"In which country are the headquarters of {n}?", hq["country"], "multi", (n, hq["name"])),
        ]
    return qs


@functools.lru_cache(maxsize=4)
def generate_world(
    seed: int = 0, n_countries: int = 12, n_cities: int = 120, n_people: int = 240, n_companies: int = 80
) -> World:
    """The generated world for `seed` (cached); about 1,900 questions over 440 passages by default."""
    rng = random.Random(seed)
    cities, people, companies = _entities(rng, n_countries, n_cities, n_people, n_companies)
    passages = _passages(cities, people, companies)
    raw = _questions(cities, people, companies)
    rng.shuffle(raw)
    questions = tuple(
        {
            "id": f"world-{i}",
            "question": q,
            "golden_answers": [a],
            "source": f"world-{kind}-hop",
            "supporting_titles": list(titles),
            "split": "test" if i % 5 == 0 else "train",
            "hops": 2 if kind == "multi" else 1,
        }
        for i, (q, a, kind, titles) in enumerate(raw)
    )
    return World(tuple(passages), questions)
