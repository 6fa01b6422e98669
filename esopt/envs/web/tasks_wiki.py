"""Task templates of the wiki (__WIKIPEDIA__)."""

from __future__ import annotations

from esopt.envs.web.tasks import DONE, answer, click, db_check, fill, pick, select, spec, template
from esopt.envs.web.world import FIRST, LAST

CITIES = "SELECT * FROM wiki_pages WHERE category='Cities' ORDER BY id"
COUNTRIES = "SELECT * FROM wiki_pages WHERE category='Countries' ORDER BY id"


def fact(db, page_id: int, key: str) -> str:
    return db.execute("SELECT value FROM wiki_facts WHERE page_id=? AND key=?", (page_id, key)).fetchone()[0]


def search(title: str) -> list[list]:
    return [fill("textbox", "Search the wiki", title), click("button", "Search"), click("link", title)]


@template("wiki", 1, "train", "What is the population of {{city}}?")
def wiki_population(db, rng):
    c = pick(db, rng, CITIES)
    value = fact(db, c["id"], "Population")
    return spec({"city": c["title"]}, f"__WIKIPEDIA__/page/{c['slug']}", [answer(value)], exact=value)


@template("wiki", 1, "validation", "In which year was {{city}} founded?")
def wiki_founded(db, rng):
    c = pick(db, rng, CITIES)
    value = fact(db, c["id"], "Founded")
    return spec({"city": c["title"]}, f"__WIKIPEDIA__/page/{c['slug']}", [answer(value)], exact=value)


@template("wiki", 1, "test", "What is the currency of {{country}}?")
def wiki_currency(db, rng):
    c = pick(db, rng, COUNTRIES)
    value = fact(db, c["id"], "Currency")
    return spec({"country": c["title"]}, f"__WIKIPEDIA__/page/{c['slug']}", [answer(value)], exact=value)


@template("wiki", 2, "train", "What is the capital of {{country}}?")
def wiki_capital(db, rng):
    c = pick(db, rng, COUNTRIES)
    value = fact(db, c["id"], "Capital")
    return spec({"country": c["title"]}, "__WIKIPEDIA__/", [click("link", c["title"]), answer(value)], exact=value)


@template("wiki", 2, "train", "Who is the mayor of {{city}}?")
def wiki_mayor(db, rng):
    c = pick(db, rng, CITIES)
    value = fact(db, c["id"], "Mayor")
    return spec({"city": c["title"]}, "__WIKIPEDIA__/", search(c["title"]) + [answer(value)], exact=value)


@template("wiki", 2, "test", "What is the elevation of {{city}} in meters?")
def wiki_elevation(db, rng):
    c = pick(db, rng, CITIES)
    meters = fact(db, c["id"], "Elevation").split()[0]
    return spec({"city": c["title"]}, "__WIKIPEDIA__/", search(c["title"]) + [answer(f"{meters} m")], include=[meters])


@template("wiki", 3, "validation", "Which city of {{country}} has the largest population?")
def wiki_largest_city(db, rng):
    c = pick(db, rng, COUNTRIES)
    cities = [
        dict(r)
        for r in db.execute(
            "SELECT p.title, CAST(replace(g.value, ',', '') AS INTEGER) AS pop FROM wiki_pages p JOIN wiki_facts f "
            "ON f.page_id=p.id AND f.key='Country' JOIN wiki_facts g ON g.page_id=p.id AND g.key='Population' "
            "WHERE f.value=? ORDER BY p.title",
            (c["title"],),
        )
    ]
    oracle = [click("link", c["title"])]
    for city in cities:
        oracle += [click("link", city["title"]), ["back"]]
    return spec(
        {"country": c["title"]},
        "__WIKIPEDIA__/",
        oracle + [answer(max(cities, key=lambda x: x["pop"])["title"])],
        exact=max(cities, key=lambda x: x["pop"])["title"],
    )


@template("wiki", 3, "train", "Update the wiki page of {{city}}: its mayor is now {{mayor}}.")
def wiki_new_mayor(db, rng):
    c = pick(db, rng, CITIES)
    mayor = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    while mayor == fact(db, c["id"], "Mayor"):
        mayor = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    oracle = search(c["title"]) + [
        click("link", "Edit this page"),
        fill("textbox", "Mayor", mayor),
        click("button", "Save page"),
        DONE,
    ]
    return spec(
        {"city": c["title"], "mayor": mayor},
        "__WIKIPEDIA__/",
        oracle,
        program=[
            db_check("wiki_fact", mayor, slug=c["slug"], key="Mayor"),
            db_check("wiki_fact", fact(db, c["id"], "Population"), slug=c["slug"], key="Population"),
        ],
    )


@template("wiki", 3, "train", "Set the population of {{city}} on the wiki to {{population}}.")
def wiki_set_population(db, rng):
    c = pick(db, rng, CITIES)
    population = f"{rng.randint(20, 3000) * 1000:,}"
    oracle = search(c["title"]) + [
        click("link", "Edit this page"),
        fill("textbox", "Population", population),
        click("button", "Save page"),
        DONE,
    ]
    return spec(
        {"city": c["title"], "population": population},
        "__WIKIPEDIA__/",
        oracle,
        program=[
            db_check("wiki_fact", population, slug=c["slug"], key="Population"),
            db_check("wiki_fact", fact(db, c["id"], "Mayor"), slug=c["slug"], key="Mayor"),
        ],
    )


@template(
    "wiki", 3, "test", "Create a wiki page titled '{{title}}' in the category {{category}} with the text '{{text}}'."
)
def wiki_create_page(db, rng):
    city = pick(db, rng, CITIES)["title"]
    title = f"{rng.choice(('Old Bridge', 'Central Market', 'City Museum', 'North Gate'))} of {city}"
    category = rng.choice(("Landmarks", "Cities"))
    text = f"The {title.split(' of ')[0].lower()} is a landmark of {city}."
    oracle = [
        click("link", "Create a page"),
        fill("textbox", "Title", title),
        select("combobox", "Category", category),
        fill("textbox", "Page text", text),
        click("button", "Create page"),
        DONE,
    ]
    return spec(
        {"title": title, "category": category, "text": text},
        "__WIKIPEDIA__/",
        oracle,
        program=[
            db_check("wiki_page", category, title=title, field="category"),
            db_check("wiki_page", text, title=title, field="body"),
        ],
    )
