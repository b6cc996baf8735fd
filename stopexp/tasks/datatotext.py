"""Data-to-text: one restaurant record into one sentence (after the E2E NLG task), generated
offline and seeded. An open-ended task: many sentences are right, and their quality is a
matter of degree, measured by a reward (stopexp/tasks/rewards.py) against several references::

    Record: name[Aromi], food[Thai], area[riverside], price[cheap]
    Sentence: Aromi serves cheap Thai food in the riverside.

A record has a name, a food, an area and a price, and in half the records a rating (1..5).
The references are the record written with each of `TEMPLATES` (and a rating clause); the
toy LM learns from sentences drawn from the same templates.

`check` is the E2E slot criterion: the sentence mentions every value of its record (name,
food, area, price, rating), matched as whole words, case-insensitive; a sentence that
drops or swaps a value fails. It is independent of the references, so the `correct`
outcome and a text reward measure two different things. `answer_of` is the canonical
list of the record's values that the text mentions, so voting among paths votes on content.

Renderings: `fewshot` (plain text: `shots` solved training records, then the record and
``Sentence:``; use model.chat_template=false) and `chat` (the instruction, examples and
record as one user turn). A record's split is a hash of its text (stopexp/tasks/splits.py).
"""
from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

from stopexp.tasks.task import Task
from stopexp.tasks.splits import draw_distinct, hash_split

NAMES = ("Aromi", "Bibimbap House", "Blue Spice", "Clowns", "Cotto", "Fitzbillies", "Giraffe",
         "Loch Fyne", "Strada", "The Eagle", "The Mill", "The Phoenix", "Wildwood", "Zizzi")
FOODS = ("Chinese", "English", "French", "Indian", "Italian", "Japanese", "Thai")
AREAS = ("riverside", "city centre")
PRICES = ("cheap", "moderate", "expensive")
FIELDS = ("name", "food", "area", "price", "rating")
FORMATS = ("fewshot", "chat")
# one sentence per template; {area} reads "the riverside" / "the city centre"
TEMPLATES = (
    "{name} is a restaurant in the {area} serving {price} {food} food.",
    "{name} serves {price} {food} food in the {area}.",
    "In the {area}, {name} offers {food} food at {price} prices.",
    "{name} is a {food} place in the {area} with {price} prices.",
)
RATING = (" It is rated {rating} out of 5.", " It has a rating of {rating} out of 5.")
_RATED = re.compile(r"(?:rated|rating of)\s+([1-5])\b", re.IGNORECASE)
SHOT_POOL = 64
TOY_CHARS = string.ascii_letters + string.digits + " .,[]:'-\n"  # the toy LM's alphabet


@dataclass(frozen=True)
class Record:
    prompt_id: int
    split: str
    data: str          # "name[Aromi], food[Thai], area[riverside], price[cheap]"
    prompt: str        # what the model sees
    values: tuple      # ((field, value), ...) in FIELDS order

    @property
    def question(self) -> str:
        return self.data


def realize(values: dict, template: int, rating: int = 0) -> str:
    """The record written with TEMPLATES[template] (and RATING[rating] when it has one)."""
    text = TEMPLATES[template].format(**{k: v for k, v in values.items() if k != "rating"})
    if "rating" in values:
        text += RATING[rating].format(rating=values["rating"])
    return text


def mentions(text: str, value: str) -> bool:
    """`value` occurs in `text` as whole words, case-insensitive."""
    return re.search(rf"(?<![\w]){re.escape(value.lower())}(?![\w])", text.lower()) is not None


class DataToTextTask(Task):
    """Prompts, references (several: `references`) and the slot checker of the data-to-text
    task. `stop_sequences`: a sentence ends at a newline.

    Raises ValueError naming the task.* key when a knob is out of range."""

    name = "datatotext"
    text_level = "word"
    stop_sequences = ("\n",)
    toy_keys = ("name", "shots", "format", "instruction", "stop", "split_fractions", "seed")
    toy_chars = TOY_CHARS
    generated = True
    formats = FORMATS

    def __init__(self, shots: int = 3, format: str = "fewshot", instruction: str = "",
                 stop=("\n",), seed: int = 0, split_fractions: dict | None = None,
                 prompt_offset: int = 0):
        if format not in FORMATS:
            raise ValueError(f"task.format: {format!r}; allowed: {', '.join(FORMATS)}")
        if shots < 0:
            raise ValueError(f"task.shots: must be >= 0, got {shots}")
        self.shots, self.format, self.instruction = int(shots), format, instruction
        self.stop_sequences = tuple(stop)
        self.seed, self.prompt_offset = seed, int(prompt_offset)
        self.split_fractions = dict(split_fractions or {"train": 0.8, "val": 0.1, "test": 0.1})
        self._pool: list[Record] | None = None

    @classmethod
    def from_config(cls, task_cfg) -> "DataToTextTask":
        """The task of a task section (task=datatotext), its text decoded (stopexp.tasks.build_task)."""
        return cls(shots=task_cfg.shots, format=task_cfg.format, instruction=task_cfg.instruction,
                   stop=list(task_cfg.stop), seed=task_cfg.seed, split_fractions=dict(task_cfg.split_fractions),
                   prompt_offset=task_cfg.get("prompt_offset", 0))

    # --- generation -------------------------------------------------------------------
    def split_of(self, data: str) -> str:
        return hash_split(data, self.split_fractions)

    @staticmethod
    def _draw(rng: random.Random) -> tuple:
        values = [("name", rng.choice(NAMES)), ("food", rng.choice(FOODS)),
                  ("area", rng.choice(AREAS)), ("price", rng.choice(PRICES))]
        if rng.random() < 0.5:
            values.append(("rating", str(rng.randint(1, 5))))
        return tuple(values)

    @staticmethod
    def data_of(values) -> str:
        return ", ".join(f"{k}[{v}]" for k, v in values)

    def _records(self, split: str, n: int, stream: str) -> list[tuple]:
        return draw_distinct(f"{self.seed}:{stream}:{split}", split, n, self.split_fractions,
                             self._draw, self.data_of,
                             f"records of the {len(NAMES) * len(FOODS) * len(AREAS) * len(PRICES) * 6} "
                             "there are; lower the count",
                             skip=self.prompt_offset if stream == "problems" else 0)

    def _record(self, i: int, split: str, values, prompt: str | None = None) -> Record:
        data = self.data_of(values)
        return Record(i, split, data, prompt if prompt is not None else self.render(data), values)

    @staticmethod
    def size() -> int:
        """How many distinct records there are: name x food x area x price x (no rating, 1..5)."""
        return len(NAMES) * len(FOODS) * len(AREAS) * len(PRICES) * 6

    def distinct(self, split: str, n: int) -> list[tuple]:
        """The records `problems` renders, unrendered (ValueError when `split` has fewer than
        `n`): checked at validate (stopexp.config.task.task_draws_the_prompts)."""
        return self._records(split, n, "problems")

    def shot_pool(self) -> list[Record]:
        """Solved training records that precede a prompt (fixed by the seed)."""
        if self._pool is None:
            drawn = self._records("train", SHOT_POOL if self.shots else 0, "shots")
            self._pool = [self._record(i, "train", v, "") for i, v in enumerate(drawn)]
        return self._pool

    def render(self, data: str) -> str:
        """The prompt for a record: `shots` solved examples (drawn by a hash of the record,
        never the record itself, each written with a template chosen the same way) and the
        record, in this task's format."""
        rng = random.Random(f"{self.seed}:shots:{data}")
        pool = [r for r in self.shot_pool() if r.data != data]
        shots = rng.sample(pool, min(self.shots, len(pool)))
        blocks = [f"Record: {r.data}\nSentence: "
                  f"{realize(dict(r.values), rng.randrange(len(TEMPLATES)), rng.randrange(len(RATING)))}"
                  for r in shots]
        if self.format == "fewshot":
            return "\n\n".join(blocks + [f"Record: {data}\nSentence:"])
        head = [self.instruction] if self.instruction else []
        return "\n\n".join(head + blocks + [f"Record: {data}"])

    def problems(self, split: str, n: int) -> list[Record]:
        """The first `n` distinct records of `split` for this task's seed (deterministic)."""
        return [self._record(i, split, v) for i, v in enumerate(self._records(split, n, "problems"))]

    def sample(self, split: str, rng: random.Random) -> Record:
        """A random record of `split` (the toy LM's training data; may repeat)."""
        while True:
            values = self._draw(rng)
            if self.split_of(self.data_of(values)) == split:
                return self._record(-1, split, values)

    def training_text(self, record: Record, rng: random.Random) -> str:
        """A sentence from a random template: what the toy LM learns (after ``Sentence:``)."""
        return " " + realize(dict(record.values), rng.randrange(len(TEMPLATES)),
                             rng.randrange(len(RATING)))

    # --- references and checking --------------------------------------------------------
    def references(self, record: Record) -> list[str]:
        """The record written with every template (and, where rated, every rating clause)."""
        rated = any(k == "rating" for k, _ in record.values)
        return [realize(dict(record.values), t, c) for t in range(len(TEMPLATES))
                for c in range(len(RATING) if rated else 1)]

    def reference(self, record: Record) -> str:
        """The first reference (for metrics that take one)."""
        return self.references(record)[0]

    @staticmethod
    def sentence(completion: str) -> str:
        """The completion's first line, stripped: the sentence that is scored."""
        return completion.strip().split("\n", 1)[0].strip()

    def answer_of(self, completion: str) -> str:
        """The values of every field the sentence mentions, canonical (sorted, "|"-joined)."""
        text = self.sentence(completion)
        found = [v for v in (*NAMES, *FOODS, *AREAS, *PRICES) if mentions(text, v)]
        found += sorted({f"rated {d}" for d in _RATED.findall(text)})
        return "|".join(sorted(found))

    def grade(self, record: Record, completion: str) -> bool:
        """Every value of the record is mentioned, and no other name, food, area or price."""
        want = {v for k, v in record.values if k != "rating"} | {
            f"rated {v}" for k, v in record.values if k == "rating"}
        return set(filter(None, self.answer_of(completion).split("|"))) == want

    def diagnose(self, record: Record, completion: str) -> dict:
        """style: ``rated`` / ``unrated`` (the record has a rating); first_error: the
        character offset where the first wrong or missing value shows (-1: none)."""
        rated = any(k == "rating" for k, _ in record.values)
        if self.grade(record, completion):
            return {"style": "rated" if rated else "unrated", "first_error": -1}
        text = self.sentence(completion)
        wrong = [m.start() for v in (*NAMES, *FOODS, *AREAS, *PRICES) if v not in dict(record.values).values()
                 for m in [re.search(rf"(?<![\w]){re.escape(v.lower())}(?![\w])", text.lower())] if m]
        return {"style": "rated" if rated else "unrated",
                "first_error": min(wrong) if wrong else len(text)}
