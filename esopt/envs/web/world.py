"""The sites' data: one seeded generator writes every table of the four sites into one sqlite database.

`build_world(seed)` is a pure function of `seed` (its own `random.Random`, never the global one): the app server
and the env process each build the same template database, the server to copy per episode, the env to draw tasks
and compute their answers. Prices are distinct integers of cents, scores and populations distinct where a task
asks for an extreme, so every "which is cheapest / highest" question has one answer.

The persona logged in at every reset: shop customer 1 (`PERSONA_NAME`), forum user `FORUM_USER`, shop admin.
"""

from __future__ import annotations

import functools
import random
import re
import sqlite3
import threading

PERSONA_ID = 1
PERSONA_NAME = "Emma Lopez"
FORUM_USER = "emma_l"
ORDER_STATUSES = ("pending", "processing", "complete", "canceled")
SHIPPING = {"Standard": 500, "Express": 1500}  # cents

SCHEMA = """
CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, email TEXT, city TEXT, joined TEXT);
CREATE TABLE products(id INTEGER PRIMARY KEY, sku TEXT UNIQUE, name TEXT UNIQUE, category TEXT,
                      price_cents INTEGER, stock INTEGER, description TEXT, enabled INTEGER);
CREATE TABLE reviews(id INTEGER PRIMARY KEY, product_id INTEGER, author TEXT, rating INTEGER, title TEXT,
                     body TEXT, created TEXT);
CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER, created TEXT, status TEXT, shipping TEXT,
                    ship_name TEXT, ship_street TEXT, ship_city TEXT, ship_zip TEXT, total_cents INTEGER);
CREATE TABLE order_items(order_id INTEGER, product_id INTEGER, qty INTEGER, price_cents INTEGER);
CREATE TABLE cart_items(customer_id INTEGER, product_id INTEGER, qty INTEGER, PRIMARY KEY(customer_id, product_id));
CREATE TABLE forums(id INTEGER PRIMARY KEY, name TEXT UNIQUE, description TEXT);
CREATE TABLE posts(id INTEGER PRIMARY KEY, forum_id INTEGER, author TEXT, title TEXT UNIQUE, body TEXT,
                   score INTEGER, created TEXT);
CREATE TABLE comments(id INTEGER PRIMARY KEY, post_id INTEGER, author TEXT, body TEXT, score INTEGER, created TEXT);
CREATE TABLE votes(user TEXT, kind TEXT, target INTEGER, value INTEGER, PRIMARY KEY(user, kind, target));
CREATE TABLE wiki_pages(id INTEGER PRIMARY KEY, slug TEXT UNIQUE, title TEXT UNIQUE, category TEXT, body TEXT);
CREATE TABLE wiki_facts(page_id INTEGER, key TEXT, value TEXT, pos INTEGER, PRIMARY KEY(page_id, key));
"""

FIRST = (
    "Emma",
    "Liam",
    "Olivia",
    "Noah",
    "Ava",
    "Mateo",
    "Sofia",
    "Lucas",
    "Mia",
    "Ethan",
    "Zara",
    "Omar",
    "Hana",
    "Ravi",
    "Chloe",
    "Diego",
    "Ingrid",
    "Kofi",
    "Lena",
    "Marco",
    "Nadia",
    "Pavel",
    "Quinn",
    "Rosa",
)
LAST = (
    "Lopez",
    "Smith",
    "Chen",
    "Okafor",
    "Novak",
    "Garcia",
    "Kim",
    "Rossi",
    "Haddad",
    "Berg",
    "Tanaka",
    "Silva",
    "Murphy",
    "Ivanova",
    "Dubois",
    "Mensah",
)
CITIES = ("Springfield", "Riverton", "Lakeside", "Fairview", "Brookfield", "Ashford", "Millbrook", "Oakdale")
CATEGORIES = {
    "Electronics": ("Headphones", "Speaker", "Charger", "Keyboard", "Mouse", "Webcam", "Power Bank", "Monitor"),
    "Kitchen": ("Kettle", "Blender", "Toaster", "Frying Pan", "Knife Set", "Coffee Grinder", "Mug Set", "Scale"),
    "Outdoor": ("Tent", "Backpack", "Lantern", "Water Bottle", "Hammock", "Sleeping Bag", "Camp Stove", "Compass"),
    "Beauty": ("Face Cream", "Shampoo", "Hair Dryer", "Lip Balm", "Perfume", "Nail Kit", "Sunscreen", "Body Wash"),
    "Toys": ("Puzzle", "Robot Kit", "Plush Bear", "Kite", "Board Game", "Yo-Yo", "Race Car", "Doll House"),
    "Office": ("Notebook", "Desk Lamp", "Stapler", "Pen Set", "Planner", "Desk Organizer", "Label Maker", "Chair Mat"),
}
BRANDS = (
    "Aurora",
    "Basalt",
    "Cobalt",
    "Dune",
    "Ember",
    "Fjord",
    "Granite",
    "Harbor",
    "Iris",
    "Juniper",
    "Kestrel",
    "Lumen",
    "Meadow",
    "Nimbus",
    "Onyx",
    "Pebble",
)
REVIEW_TITLES = (
    "Great value",
    "Works as described",
    "Not what I expected",
    "Excellent quality",
    "Broke quickly",
    "Would buy again",
    "Decent for the price",
    "Love it",
    "Too small",
    "Fast shipping",
)
FORUMS = {
    "gadgets": "Talk about phones, laptops and everything with a battery",
    "cooking": "Recipes, techniques and kitchen disasters",
    "hiking": "Trails, gear and trip reports",
    "books": "What are you reading?",
    "gardening": "Plants, soil and patience",
    "movies": "Reviews and recommendations",
}
TOPICS = (
    "tips for beginners",
    "my first attempt",
    "what do you recommend",
    "a weekly thread",
    "an unpopular opinion",
    "the best of this year",
    "a question about basics",
    "lessons learned",
    "a budget option",
    "help needed",
    "show and tell",
    "a long-term review",
)
COMMENTS = (
    "Thanks for sharing!",
    "I disagree, but good points.",
    "This helped me a lot.",
    "Any photos?",
    "Same experience here.",
    "Could you explain more?",
    "Great write-up.",
    "I tried this and it worked.",
)
COUNTRIES = ("Arvenia", "Belmora", "Caldoria", "Drevan", "Estmark", "Folaria", "Galvania", "Hestria")
CITY_PARTS = ("Port", "Lake", "Mount", "New", "Saint", "East", "West", "Old")
CITY_ROOTS = (
    "Aven",
    "Brisa",
    "Corda",
    "Delve",
    "Eska",
    "Fenn",
    "Gallo",
    "Hollis",
    "Istra",
    "Jorva",
    "Kell",
    "Lorne",
    "Marra",
    "Norve",
    "Ostra",
    "Pell",
    "Quell",
    "Rhyn",
    "Sella",
    "Torv",
)
CURRENCIES = ("crown", "mark", "florin", "dinar", "thaler", "ducat", "real", "guilder")


def money(cents: int) -> str:
    """Cents as the sites print them: $1,234.50."""
    return f"${cents / 100:,.2f}"


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "page"


def _date(rng: random.Random, year: int = 2025) -> str:
    return f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _shop(db: sqlite3.Connection, rng: random.Random) -> None:
    names = [f"{FIRST[i % len(FIRST)]} {LAST[(i * 7 + i // len(FIRST)) % len(LAST)]}" for i in range(30)]
    names[0] = PERSONA_NAME
    for i, name in enumerate(names, 1):
        email = name.lower().replace(" ", ".") + f"{i}@example.com"
        db.execute("INSERT INTO customers VALUES (?,?,?,?,?)", (i, name, email, rng.choice(CITIES), _date(rng, 2024)))
    prices = rng.sample(range(399, 25000), 48)
    brands = list(BRANDS)
    pid = 0
    for category, nouns in CATEGORIES.items():
        rng.shuffle(brands)
        for k, noun in enumerate(nouns):
            pid += 1
            name = f"{brands[k]} {noun}"
            sku = f"{category[:3].upper()}-{100 + pid * 7}"
            kind = rng.choice(("compact", "sturdy", "lightweight", "premium"))
            desc = f"The {name} is a {kind} pick for {category.lower()}."
            db.execute(
                "INSERT INTO products VALUES (?,?,?,?,?,?,?,?)",
                (pid, sku, name, category, prices[pid - 1], rng.randint(0, 60), desc, 1),
            )
            for _ in range(rng.randint(2, 7)):
                db.execute(
                    "INSERT INTO reviews(product_id, author, rating, title, body, created) VALUES (?,?,?,?,?,?)",
                    (
                        pid,
                        rng.choice(names[1:]),
                        rng.randint(1, 5),
                        rng.choice(REVIEW_TITLES),
                        f"My honest take on the {noun.lower()}.",
                        _date(rng),
                    ),
                )
    _orders(db, rng, len(names))
    for p in rng.sample(range(1, 49), 3):
        db.execute("INSERT INTO cart_items VALUES (?,?,?)", (PERSONA_ID, p, rng.randint(1, 3)))


def _orders(db: sqlite3.Connection, rng: random.Random, customers: int) -> None:
    price = dict(db.execute("SELECT id, price_cents FROM products"))
    streets = ("Elm St", "Oak Ave", "Pine Rd", "Maple Dr", "Cedar Ln")
    for oid in range(1, 151):
        cust = PERSONA_ID if oid % 12 == 5 else rng.randint(2, customers)
        name, city = db.execute("SELECT name, city FROM customers WHERE id=?", (cust,)).fetchone()
        shipping = rng.choice(tuple(SHIPPING))
        items = [(p, rng.randint(1, 4)) for p in rng.sample(range(1, 49), rng.randint(1, 3))]
        total = sum(price[p] * q for p, q in items) + SHIPPING[shipping]
        db.execute(
            "INSERT INTO orders VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                oid,
                cust,
                _date(rng),
                ORDER_STATUSES[oid // 12 % 4] if cust == PERSONA_ID else rng.choice(ORDER_STATUSES),
                shipping,
                name,
                f"{rng.randint(1, 999)} {rng.choice(streets)}",
                city,
                f"{rng.randint(10000, 99999)}",
                total,
            ),
        )
        db.executemany("INSERT INTO order_items VALUES (?,?,?,?)", [(oid, p, q, price[p]) for p, q in items])


def _forum(db: sqlite3.Connection, rng: random.Random) -> None:
    users = [f"{f.lower()}{rng.randint(10, 99)}" for f in FIRST]
    for fid, (name, desc) in enumerate(FORUMS.items(), 1):
        db.execute("INSERT INTO forums VALUES (?,?,?)", (fid, name, desc))
    scores = rng.sample(range(-20, 900), 60)
    for pid in range(1, 61):
        fid = (pid - 1) % len(FORUMS) + 1
        forum = list(FORUMS)[fid - 1]
        title = f"{forum.capitalize()}: {TOPICS[(pid - 1) // len(FORUMS) % len(TOPICS)]} #{pid}"
        body = f"Posting about {TOPICS[pid % len(TOPICS)]} in {forum}. What do you all think?"
        db.execute(
            "INSERT INTO posts VALUES (?,?,?,?,?,?,?)",
            (pid, fid, rng.choice(users), title, body, scores[pid - 1], _date(rng)),
        )
        for c in rng.sample(range(-5, 200), rng.randint(0, 6)):
            db.execute(
                "INSERT INTO comments(post_id, author, body, score, created) VALUES (?,?,?,?,?)",
                (pid, rng.choice(users), rng.choice(COMMENTS), c, _date(rng)),
            )


def _wiki(db: sqlite3.Connection, rng: random.Random) -> None:
    roots = list(CITY_ROOTS)
    rng.shuffle(roots)
    populations = rng.sample(range(20_000, 3_000_000), 40)
    city_no = 0
    for c, country in enumerate(COUNTRIES):
        cities = []
        for _ in range(5):
            root = roots[city_no % len(roots)]
            half = city_no // len(roots)
            cities.append(
                (
                    f"{CITY_PARTS[half + c % 2]} {root}" if city_no % 2 else f"{root}{('ia', 'on')[half]}",
                    populations[city_no],
                )
            )
            city_no += 1
        capital = max(cities, key=lambda x: x[1])[0] if c % 2 else cities[0][0]
        body = (
            f"{country} is a country with {len(cities)} major cities. Its capital is {capital}. "
            f"The economy of {country} relies on trade and farming."
        )
        pid = _page(db, country, "Countries", body)
        _facts(
            db,
            pid,
            {
                "Capital": capital,
                "Population": f"{sum(p for _, p in cities) * 3:,}",
                "Area": f"{rng.randint(20, 900) * 1000:,} km2",
                "Currency": CURRENCIES[c],
            },
        )
        for name, pop in cities:
            body = (
                f"{name} is a city in {country}. It is known for its "
                f"{rng.choice(('harbor', 'old bridge', 'university', 'market', 'cathedral', 'festival'))}."
            )
            cid = _page(db, name, "Cities", body)
            _facts(
                db,
                cid,
                {
                    "Country": country,
                    "Population": f"{pop:,}",
                    "Founded": str(rng.randint(900, 1900)),
                    "Elevation": f"{rng.randint(2, 2400)} m",
                    "Mayor": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                },
            )


def _page(db: sqlite3.Connection, title: str, category: str, body: str) -> int:
    cur = db.execute(
        "INSERT INTO wiki_pages(slug, title, category, body) VALUES (?,?,?,?)", (slugify(title), title, category, body)
    )
    return int(cur.lastrowid)


def _facts(db: sqlite3.Connection, page_id: int, facts: dict[str, str]) -> None:
    db.executemany(
        "INSERT INTO wiki_facts VALUES (?,?,?,?)", [(page_id, k, v, n) for n, (k, v) in enumerate(facts.items())]
    )


def build_world(seed: int = 0) -> sqlite3.Connection:
    """A fresh in-memory database with every site's tables and the data of world `seed`."""
    rng = random.Random(f"esopt-web-world-{seed}")
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.executescript(SCHEMA)
    _shop(db, rng)
    _forum(db, rng)
    _wiki(db, rng)
    db.commit()
    return db


_WORLD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def _cached(seed: int) -> sqlite3.Connection:
    return build_world(seed)


def template_world(seed: int = 0) -> sqlite3.Connection:
    """The read-only template database of world `seed`, built once per process (callers must not write)."""
    with _WORLD_LOCK:
        return _cached(seed)


def copy_db(source: sqlite3.Connection) -> sqlite3.Connection:
    """An independent in-memory copy of `source` (sqlite's online backup: ~1 ms for a world)."""
    dst = sqlite3.connect(":memory:", check_same_thread=False)
    dst.row_factory = sqlite3.Row
    source.backup(dst)
    return dst


def dump_db(db: sqlite3.Connection) -> bytes:
    """The database as bytes (sqlite's serialized form; an SQL dump on Python 3.10, which lacks `serialize`)."""
    if hasattr(db, "serialize"):
        return db.serialize()
    return "\n".join(db.iterdump()).encode()


def load_db(data: bytes) -> sqlite3.Connection:
    """A database from `dump_db`'s bytes."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.row_factory = sqlite3.Row
    if hasattr(db, "deserialize"):
        db.deserialize(data)
    else:
        db.executescript(data.decode())
    return db
