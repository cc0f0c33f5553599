"""Prompts made here from templates: math word problems and general requests.

A quarter of the templates is held out: evaluation prompts come from those, training
prompts never do (docs/design.md invariant 27). Everything is drawn from one
`random.Random(seed)`: the same seed gives the same list on every machine. Distinct
prompts only; a family that cannot give `count` distinct prompts is an error.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Collection

NAMES = tuple(
    "Ava Ben Carla Dev Elena Farid Grace Hiro Ines Jamal Kira Liam Maya "
    "Noah Olga Pablo Quinn Rosa Sam Tara Uma Victor Wen Yusuf Zoe".split()
)
ITEMS = (
    ("apples", 0.5),
    ("notebooks", 2.25),
    ("pencils", 0.75),
    ("stickers", 0.2),
    ("cupcakes", 1.5),
    ("tickets", 12.0),
    ("marbles", 0.1),
    ("books", 8.5),
    ("plants", 4.0),
    ("candles", 3.25),
)
PLACES = ("market", "bakery", "school fair", "bookshop", "garden centre", "toy store")
VEHICLES = (("a car", 60), ("a train", 90), ("a bicycle", 15), ("a bus", 45), ("a boat", 20))


def _math_templates(rng: random.Random) -> tuple[str, ...]:
    """Every template filled with one draw of names, items and numbers (questions only; the
    target writes the solution); the template id is the index."""
    a, b = rng.sample(NAMES, 2)
    (item, price), (other, other_price) = rng.sample(ITEMS, 2)
    n, m, k = rng.randint(3, 48), rng.randint(2, 19), rng.randint(2, 9)
    percent = rng.choice((10, 15, 20, 25, 30, 40, 50))
    vehicle, speed = rng.choice(VEHICLES)
    hours = rng.randint(2, 7)
    place = rng.choice(PLACES)
    return (
        f"{a} has {n} {item}. {b} gives {a} {m} more, and then {a} shares them equally among {k} friends, "
        f"keeping whatever is left over. How many {item} does {a} keep?",
        f"At the {place}, {item} cost ${price:.2f} each and {other} cost ${other_price:.2f} each. {a} buys {n} {item} "
        f"and {m} {other}. How much does {a} spend in total?",
        f"A shop sells {item} for ${price * k:.2f} each. During a sale everything is {percent}% off. "
        f"How much do {m} {item} cost during the sale?",
        f"{vehicle.capitalize()} travels at {speed} km per hour for {hours} hours, then at {speed // 2 + 5} km per hour "
        f"for {k} more hours. How far does it travel altogether?",
        f"{a} is {n} years old. {b} is {k} years younger than twice {a}'s age. How old will {b} be in {m} years?",
        f"A class of {n + 10} students is split into teams of {k}. Students who do not fit into a full team help the "
        f"teacher. How many full teams are there, and how many students help the teacher?",
        f"{a} saves ${m} every week. {b} starts with ${n * 3} and saves ${k} every week. After how many weeks "
        f"will {a} have saved more than {b}, if {a} starts from nothing?",
        f"A rectangular garden is {n} metres long and {m} metres wide. A path {k} metres wide runs all the way "
        f"around it. What is the area of the path?",
        f"{a} reads {m} pages on Monday, twice as many on Tuesday, and {k} fewer than Tuesday on Wednesday. "
        f"The book has {n * 10} pages. How many pages are left to read?",
        f"A tank holds {n * 20} litres of water. It leaks {k} litres per hour while a pump adds {m} litres per hour. "
        f"If the tank starts half full, how many hours until it is {'full' if m > k else 'empty'}?",
        f"{a} bought {n} {item} and sold {percent}% of them at ${price * 2:.2f} each. How much money did {a} make "
        f"from the sale, and how many {item} are left?",
        f"The price of a {item[:-1]} went up from ${price * 4:.2f} to ${price * 4 + k:.2f}. By what percentage did "
        f"the price increase? Round to one decimal place.",
        f"{a} and {b} share ${n * 12} in the ratio {k}:{m}. How much more does the one with the larger share get?",
        f"A recipe needs {k} eggs for every {m} cups of flour. {a} has {n} cups of flour. How many eggs does {a} "
        f"need to use all of the flour?",
        f"In a bag there are {n} red, {m} blue and {k} green marbles. {a} takes one marble without looking. "
        f"What is the probability that it is not blue? Give the answer as a fraction in lowest terms.",
        f"A runner completes a {k}-kilometre race in {n + 20} minutes. What was the average pace in minutes per "
        f"kilometre, and how long would a {m}-kilometre run take at the same pace?",
        f"{a} earns ${m + 10} per hour and works {k + 30} hours a week. {percent}% of the pay goes to taxes. "
        f"How much does {a} take home in {hours} weeks?",
        f"The sum of three consecutive integers is {3 * n + 3}. What is the largest of the three?",
        f"A train leaves at {k}:{rng.choice(('05', '15', '30', '45'))} and the trip takes {n + 30} minutes. "
        f"{a} needs {m} minutes to walk from the station to work. At what time does {a} arrive at work?",
        f"{a} plants {n} seeds. {percent}% of them do not sprout, and each plant that grows gives {k} tomatoes. "
        f"How many tomatoes does {a} harvest?",
    )


TOPICS = (
    "photosynthesis",
    "the French Revolution",
    "black holes",
    "compound interest",
    "machine learning",
    "the water cycle",
    "climate change",
    "the stock market",
    "vaccines",
    "plate tectonics",
    "the Roman Empire",
    "renewable energy",
    "blockchain",
    "the human immune system",
    "inflation",
    "the printing press",
    "quantum computing",
    "coral reefs",
    "the Silk Road",
    "sleep",
    "public speaking",
    "remote work",
    "urban gardening",
    "electric cars",
    "the Internet",
    "meditation",
    "supply and demand",
    "the Moon landing",
    "antibiotic resistance",
    "recycling",
    "volcanoes",
    "the theory of evolution",
    "time management",
    "learning a second language",
    "the Olympic Games",
    "jazz",
    "password security",
    "healthy eating",
    "the Great Wall of China",
    "honeybees",
    "minimalism",
    "solar panels",
)
PAIRS = (
    ("a virus", "a bacterium"),
    ("weather", "climate"),
    ("a lake", "a pond"),
    ("stocks", "bonds"),
    ("TCP", "UDP"),
    ("a simile", "a metaphor"),
    ("renting", "buying a home"),
    ("RAM", "storage"),
    ("an alligator", "a crocodile"),
    ("baking soda", "baking powder"),
    ("a democracy", "a republic"),
    ("speed", "velocity"),
    ("tea", "coffee"),
    ("a novel", "a novella"),
    ("Python lists", "tuples"),
)
AUDIENCES = ("a ten-year-old", "a busy manager", "a high-school student", "my grandmother", "a complete beginner", "an expert")
FORMS = ("a short poem", "a haiku", "a limerick", "a two-paragraph story", "a product description", "a tweet", "a slogan")
ACTIVITIES = (
    "a weekend trip to the mountains",
    "a birthday party for a seven-year-old",
    "a job interview",
    "a first marathon",
    "moving to a new city",
    "a small vegetable garden",
    "a team meeting",
    "a week of healthy dinners",
    "a study schedule for exams",
)


def _chat_templates(rng: random.Random) -> tuple[str, ...]:
    topic = rng.choice(TOPICS)
    first, second = rng.choice(PAIRS)
    audience, form, activity = rng.choice(AUDIENCES), rng.choice(FORMS), rng.choice(ACTIVITIES)
    count = rng.randint(3, 7)
    return (
        f"Explain {topic} to {audience}.",
        f"What is the difference between {first} and {second}?",
        f"Write {form} about {topic}.",
        f"Give me {count} tips for {activity}.",
        f"Help me plan {activity}. Make a step-by-step list.",
        f"Summarize the main ideas of {topic} in {count} bullet points.",
        f"What are the pros and cons of {topic}?",
        f"Write a short email to my team about {activity}.",
        f"I have to give a five-minute talk about {topic}. Can you draft an outline?",
        f"Suggest {count} interesting questions a student might ask about {topic}, with short answers.",
        f"Compare {first} and {second} in a table with {count} rows.",
        f"Write a friendly message inviting a colleague to join me for {activity}.",
        f"What are common misconceptions about {topic}?",
        f"Describe {topic} in exactly three sentences.",
        f"Tell me a fun fact about {topic} and explain why it is true.",
        f'Rewrite this sentence to sound more professional: "we gotta talk about {topic} asap".',
        f"Create a short quiz with {count} multiple-choice questions about {topic}.",
        f"How would you explain the importance of {topic} to {audience}? Keep it under 150 words.",
    )


# Near-duplicates (docs/design.md invariant 27): prompts of one template, read back from any text
# by `skeleton` (one skeleton per template); templates that ask the same thing in other words count
# as one (SAME_REQUEST). Template ids are indices: add templates at the end.
SAME_REQUEST = {"math": (), "chat": ((0, 17), (1, 10), (3, 4), (5, 13), (7, 11), (9, 16))}
HELDOUT_SHARE = 0.25
_FILLERS = {*NAMES, *PLACES, *TOPICS, *AUDIENCES, *FORMS, *ACTIVITIES, *(p for pair in PAIRS for p in pair), "full", "empty"}
_FILLERS |= {w for item, _ in ITEMS for w in (item, item[:-1])} | {w for v, _ in VEHICLES for w in (v, v.capitalize())}
_FILLER = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, _FILLERS), key=len, reverse=True)) + r")\b")
_NUMBER = re.compile(r"\d+(?:[.:]\d+)?")


def skeleton(text: str) -> str:
    """`text` with its fillers replaced by `_` and its numbers by `#`: equal for near-duplicates."""
    return _NUMBER.sub("#", _FILLER.sub("_", text))


@functools.cache
def heldout_templates(family: str, num_templates: int) -> frozenset[int]:
    """The ids of `family`'s held-out templates: whole groups of SAME_REQUEST (the others
    alone) in an order seeded by the family's name, until a quarter of the templates."""
    grouped = {i for group in SAME_REQUEST[family] for i in group}
    groups = [*SAME_REQUEST[family], *((i,) for i in range(num_templates) if i not in grouped)]
    random.Random(f"dflash-heldout-{family}").shuffle(groups)
    held: list[int] = []
    for group in groups:
        held += group if len(held) < HELDOUT_SHARE * num_templates else ()
    return frozenset(held)


MAX_MISSES = 20_000  # consecutive repeats after which a template family counts as exhausted


def _distinct(make, count: int, seed: int, family: str, heldout: bool, exclude: Collection[str]) -> list[str]:
    """`count` distinct prompts of the training (or held-out) templates, none whose skeleton is in `exclude`."""
    rng = random.Random(seed)
    prompts: dict[str, None] = {}
    misses = 0
    while len(prompts) < count:
        before = len(prompts)
        texts = make(rng)
        held = heldout_templates(family, len(texts))
        text = texts[rng.choice(sorted(held) if heldout else [i for i in range(len(texts)) if i not in held])]
        if not exclude or skeleton(text) not in exclude:
            prompts.setdefault(text, None)
        misses = misses + 1 if len(prompts) == before else 0
        if misses > MAX_MISSES:
            raise ValueError(f"the {family} templates gave only {len(prompts)} distinct prompts of the {count} asked for")
    return list(prompts)


def math_word_problems(count: int, seed: int = 0, heldout: bool = False, exclude: Collection[str] = ()) -> list[str]:
    """`count` distinct grade-school word problems (questions only), seeded: from the training
    templates, or the held-out ones; none whose skeleton is in `exclude`."""
    return _distinct(_math_templates, count, seed, "math", heldout, exclude)


def chat_requests(count: int, seed: int = 0, heldout: bool = False, exclude: Collection[str] = ()) -> list[str]:
    """`count` distinct general requests, seeded, as `math_word_problems` draws them."""
    return _distinct(_chat_templates, count, seed, "chat", heldout, exclude)
