"""The wordings of the held-out worlds (`drmas_envs.search.heldout`): fact sentences, distractor sentences,
question frames and two-hop descriptors.

Each pool is (training wordings, held-out wordings): training worlds use only the first, held-out worlds
(validation and test) both, so a policy fitted to the training worlds meets sentences and questions it never
saw. Slots: `{s}` the passage's subject (a name, or "the city", "the firm", ...), `{a}` the answer, `{x}`
another entity of the answer's type, and in distractor sentences `{city}`, `{year}`, `{person}`, `{country}`,
`{river}`, `{prof}`, `{industry}`, `{company}`, `{n}` (a count), `{landmark}`, `{year}` (a year after the
subject's own: birth or founding) and `{early}` (one before it), so the smallest or largest year of a passage
is never the answer by rule. "a" before a vowel becomes "an".
"""

from __future__ import annotations

Pool = tuple[tuple[str, ...], tuple[str, ...]]
"""(training wordings, held-out wordings)."""

FACTS: dict[str, Pool] = {
    "city_country": (
        (
            "{s} is a city in {a}.",
            "{s} lies in {a}, close to the border with {x}.",
            "Although many of its traders come from {x}, {s} is part of {a}.",
            "{a} counts {s} among its largest towns.",
            "The people of {s} have been subjects of {a} for centuries, not of {x}.",
        ),
        ("{s} sits within the borders of {a}.", "Travellers reach {s} in {a} by the road from {x}."),
    ),
    "city_river": (
        (
            "{s} lies on the {a} river.",
            "The {a} flows through {s}.",
            "{s} was built on the banks of the {a}.",
            "The {a}, not the nearby {x}, runs through {s}.",
            "{s} stands on the {a} river, which later joins the {x}.",
        ),
        ("Boats on the {a} stop at {s} on their way to the {x}.", "{s} grew up beside the waters of the {a}."),
    ),
    "city_founded": (
        (
            "{s} was founded in {a}.",
            "{s} dates back to {a}.",
            "Founded in {a}, {s} received its charter in {x}.",
            "In {a} a band of settlers founded {s}.",
            "{s} received its charter in {x}, long after its founding in {a}.",
        ),
        ("The first houses of {s} went up in {a}.", "{s} has stood since {a}, and its walls since {x}."),
    ),
    "person_birthplace": (
        (
            "{s} was born in {a}.",
            "{a} is the city where {s} was born.",
            "Born in {a}, {s} left home young.",
            "{s} grew up in {x} but was born in {a}.",
            "The birthplace of {s} was {a}, not {x} as is often said.",
        ),
        ("{a}, a day's ride from {x}, saw the birth of {s}.", "{s} first saw daylight in {a}."),
    ),
    "person_birth_year": (
        (
            "{s} was born in the year {a}.",
            "The year {a} saw the birth of {s}.",
            "{s} (born {a}) came from a large family.",
            "{s} was born in {a} and left home in {x}.",
            "Records give {a} as the year of {s}'s birth, though some say {x}.",
        ),
        ("{s} arrived in the world in {a}.", "It was in {a}, not {x}, that {s} was born."),
    ),
    "person_profession": (
        (
            "{s} worked as a {a}.",
            "By profession {s} was a {a}.",
            "{s} became a {a} after early years as a {x}.",
            "Trained as a {x}, {s} made a name as a {a}.",
            "{s} is best known as a {a}.",
        ),
        ("{s} earned a living as a {a}, never as a {x}.", "The craft of a {a} kept {s} busy for life."),
    ),
    "company_founder": (
        (
            "{s} was founded by {a}.",
            "{a} founded {s}.",
            "{s} was set up by {a} with money from {x}.",
            "{x} has chaired {s} for years, but its founder was {a}.",
            "The founder of {s} was {a}.",
        ),
        ("{a} started {s}, later handing it to {x}.", "It was {a} who established {s}."),
    ),
    "company_founded": (
        (
            "{s} was founded in {a}.",
            "{s} dates from {a}.",
            "{s} opened its doors in {a} and moved to new premises in {x}.",
            "Since its founding in {a}, {s} has kept its name.",
            "The year {a} saw the founding of {s}.",
        ),
        ("{s} has been trading since {a}.", "{s} began business in {a}, well before {x}."),
    ),
    "company_industry": (
        (
            "{s} is a {a} company.",
            "{s} works in {a}.",
            "{s} began in {x} but moved into {a}.",
            "The main trade of {s} is {a}.",
            "{s} is known for {a}, and to a lesser extent {x}.",
        ),
        ("{a} is the business of {s}.", "{s} earns its money from {a}, not from {x}."),
    ),
    "company_hq": (
        (
            "The headquarters of {s} are in {a}.",
            "{s} has its head office in {a}.",
            "{s} is based in {a} and runs a plant in {x}.",
            "From its base in {a}, {s} ships goods to {x}.",
            "Although its largest plant is in {x}, {s} is headquartered in {a}.",
        ),
        ("{a} is home to the head office of {s}.", "{s} keeps its main offices in {a}, with a branch in {x}."),
    ),
}
"""Fact type -> its sentences."""

DISTRACTORS: dict[str, tuple[str, ...]] = {
    "moved": (
        "In {year}, {s} moved to {city}.",
        "{s} settled in {city} in {year}.",
        "{s} lived in {city} from {year}.",
    ),
    "relative": ("{s} was a cousin of {person}.", "{person} was a close friend of {s}.", "{s} studied with {person}."),
    "family": ("The family of {s} had farmed near {city} since {early}.", "{s}'s grandfather was born in {early}."),
    "mentor": (
        "{s}'s mentor was {person}, a {prof}.",
        "{s} learned from {person}, a {prof}.",
        "A {prof} named {person} taught {s}.",
    ),
    "workplace": ("{s} worked mostly in {city} and retired in {year}.", "From {year} {s} worked in {city}."),
    "twin": ("{s} is twinned with {city} in {country}.", "Traders from {city}, in {country}, visit {s} each spring."),
    "canal": ("A canal links {s} to the {river}.", "The {river} rises in the hills above {s}."),
    "inhabitants": ("{s} has about {n} inhabitants.", "Some {n} people live in {s}."),
    "landmark": ("The {landmark} of {s} was built in {year}.", "In {year} the {landmark} of {s} was finished."),
    "merchants": (
        "Merchants from {city} came to {s} in {year}.",
        "A great fire struck {s} in {year}, and {city} sent help.",
    ),
    "settled": (
        "Traces of a village from {early} lie under {s}.",
        "Herders had camped on the site of {s} since {early}.",
    ),
    "chair": ("{person} has chaired {s} since {year}.", "Since {year} {s} has been led by {person}."),
    "sideline": ("{s} also has a small {industry} business.", "A side line in {industry} opened in {year}."),
    "staff": ("{s} employs {n} people.", "Some {n} workers are on the books of {s}."),
    "workshop": ("The land {s} stands on was bought in {early}.", "A mill stood on the site of {s} from {early}."),
    "plant": ("{s} opened a plant in {city} in {year}.", "A second plant of {s} stands in {city}."),
    "rival": ("A rival firm, {company}, competes with {s}.", "{company} is the main rival of {s}."),
}
"""Distractor kind -> its sentences: other entities and numbers inside a passage."""

FRAMES: dict[str, Pool] = {
    "country": (
        (
            "In which country is {e}?",
            "Which country is {e} in?",
            "{e} lies in which country?",
            "What country is {e} part of?",
            "Name the country that {e} belongs to.",
        ),
        ("{e} is located in what country?", "To which country does {e} belong?"),
    ),
    "river": (
        (
            "On which river does {e} lie?",
            "Which river flows through {e}?",
            "What river is {e} built on?",
            "{e} stands on which river?",
            "Name the river that runs through {e}.",
        ),
        ("Along which river was {e} built?", "Whose waters pass {e}: which river?"),
    ),
    "founded": (
        (
            "In which year was {e} founded?",
            "When was {e} founded?",
            "What year did {e} come into being?",
            "{e} was founded in which year?",
            "Name the founding year of {e}.",
        ),
        ("What is the year of the founding of {e}?", "Since which year has {e} existed?"),
    ),
    "birthplace": (
        (
            "Where was {e} born?",
            "In which city was {e} born?",
            "What is the birthplace of {e}?",
            "{e} was born in which city?",
            "Name the city where {e} was born.",
        ),
        ("Which city is {e} a native of?", "From which city does {e} come originally?"),
    ),
    "birth_year": (
        (
            "In which year was {e} born?",
            "When was {e} born?",
            "What year was {e} born in?",
            "{e} was born in which year?",
            "Give the birth year of {e}.",
        ),
        ("In what year did {e} come into the world?", "What is the year of birth of {e}?"),
    ),
    "profession": (
        (
            "What is the profession of {e}?",
            "What did {e} work as?",
            "What job did {e} do?",
            "{e} worked in which profession?",
            "Name the occupation of {e}.",
        ),
        ("How did {e} earn a living?", "In what line of work was {e}?"),
    ),
    "founder": (
        (
            "Who founded {e}?",
            "Who was the founder of {e}?",
            "{e} was founded by whom?",
            "Name the founder of {e}.",
            "Which person set up {e}?",
        ),
        ("Who established {e}?", "By whom was {e} started?"),
    ),
    "hq": (
        (
            "In which city are the headquarters of {e}?",
            "Where is {e} based?",
            "Where is the head office of {e}?",
            "{e} has its headquarters in which city?",
            "Name the city where {e} is headquartered.",
        ),
        ("Which city houses the head office of {e}?", "From which city is {e} run?"),
    ),
    "industry": (
        (
            "What industry is {e} in?",
            "What does {e} do for business?",
            "In which trade does {e} work?",
            "{e} is a company in which industry?",
            "Name the industry of {e}.",
        ),
        ("What line of business is {e} in?", "Which trade does {e} make its money from?"),
    ),
}
"""Question relation -> its frames; `{e}` is the entity's name, or a two-hop descriptor (`BRIDGES`)."""

BRIDGES: dict[str, Pool] = {
    "birthplace": (
        (
            "the city where {e} was born",
            "the birthplace of {e}",
            "the home town of {e}",
            "the town {e} was born in",
            "the city of the birth of {e}",
        ),
        ("the place {e} comes from", "the city {e} is a native of"),
    ),
    "hq": (
        (
            "the city where {e} is headquartered",
            "the home city of {e}",
            "the city that houses the headquarters of {e}",
            "the headquarters city of {e}",
            "the city {e} is based in",
        ),
        ("the seat of {e}", "the city {e} is run from"),
    ),
    "founder": (
        (
            "the founder of {e}",
            "the person who founded {e}",
            "the one who set up {e}",
            "whoever founded {e}",
            "the founding figure of {e}",
        ),
        ("the person behind the founding of {e}", "the one who started {e}"),
    ),
}
"""First-hop relation -> descriptors of its answer that never name it: "Where was the founder of X born?"."""
