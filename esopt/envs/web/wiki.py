"""The wiki (/wiki): country and city articles with an infobox of facts, search, categories, page editing (each
infobox fact is a form field, the text a textarea) and new pages.
"""

from __future__ import annotations

from esopt.envs.web.pages import not_found, one, read_form, redirect, render, rows
from esopt.envs.web.world import slugify


def wiki_home(db, request):
    countries = rows(db, "SELECT title, slug FROM wiki_pages WHERE category='Countries' ORDER BY title")
    search = {"action": "/wiki/search", "button": "Search", "fields": [{"name": "q", "label": "Search the wiki"}]}
    links = [(c["title"], f"/wiki/page/{c['slug']}") for c in countries]
    return render(
        "wiki", "table.html", "Main page", search=search, lines=["Welcome to the wiki. Countries:"], links=links
    )


def wiki_search(db, request):
    q = request.query_params.get("q", "").strip()
    found = []
    if q:
        found = rows(
            db,
            "SELECT title, slug, body, (lower(title) LIKE ?) AS hit FROM wiki_pages "
            "WHERE lower(title) LIKE ? OR lower(body) LIKE ? ORDER BY hit DESC, title LIMIT 20",
            f"%{q.lower()}%",
            f"%{q.lower()}%",
            f"%{q.lower()}%",
        )
    search = {
        "action": "/wiki/search",
        "button": "Search",
        "fields": [{"name": "q", "label": "Search the wiki", "value": q}],
    }
    table = [[{"text": p["title"], "href": f"/wiki/page/{p['slug']}"}, p["body"][:80]] for p in found]
    return render(
        "wiki",
        "table.html",
        f"Search results for '{q}'" if q else "Search",
        search=search,
        header=["Page", "Summary"] if q else None,
        rows=table,
    )


def _page(db, slug: str) -> dict | None:
    page = one(db, "SELECT * FROM wiki_pages WHERE slug=?", slug)
    if page is not None:
        page["facts"] = [
            (r["key"], r["value"])
            for r in db.execute("SELECT key, value FROM wiki_facts WHERE page_id=? ORDER BY pos", (page["id"],))
        ]
    return page


def wiki_page(db, request):
    page = _page(db, request.path_params["slug"])
    if page is None:
        return not_found("wiki", "This page")
    related = []
    if page["category"] == "Countries":
        related = [
            (r["title"], f"/wiki/page/{r['slug']}")
            for r in db.execute(
                "SELECT p.title, p.slug FROM wiki_pages p JOIN wiki_facts f ON f.page_id=p.id "
                "WHERE f.key='Country' AND f.value=? ORDER BY p.title",
                (page["title"],),
            )
        ]
    return render(
        "wiki",
        "wiki_page.html",
        page["title"],
        facts=page["facts"],
        slug=page["slug"],
        paragraphs=[x for x in page["body"].split("\n\n") if x.strip()],
        category=page["category"],
        related=related,
        related_title=f"Cities of {page['title']}",
    )


def wiki_category(db, request):
    cat = request.path_params["cat"]
    found = rows(db, "SELECT title, slug FROM wiki_pages WHERE category=? ORDER BY title", cat)
    if not found:
        return not_found("wiki", f"Category {cat}")
    return render(
        "wiki", "table.html", f"Category: {cat}", links=[(p["title"], f"/wiki/page/{p['slug']}") for p in found]
    )


async def wiki_edit(db, request):
    page = _page(db, request.path_params["slug"])
    if page is None:
        return not_found("wiki", "This page")
    if request.method == "POST":
        form = await read_form(request)
        for key, _ in page["facts"]:
            if f"fact_{key}" in form:
                db.execute(
                    "UPDATE wiki_facts SET value=? WHERE page_id=? AND key=?",
                    (str(form[f"fact_{key}"]).strip()[:200], page["id"], key),
                )
        if "body" in form:
            db.execute("UPDATE wiki_pages SET body=? WHERE id=?", (str(form["body"]).strip()[:5000], page["id"]))
        return redirect(f"/wiki/page/{page['slug']}")
    fields = [{"name": f"fact_{k}", "label": k, "value": v} for k, v in page["facts"]]
    fields.append({"name": "body", "label": "Page text", "kind": "textarea", "value": page["body"]})
    return render(
        "wiki",
        "form.html",
        f"Editing {page['title']}",
        fields=fields,
        button="Save page",
        action=f"/wiki/page/{page['slug']}/edit",
    )


async def wiki_new(db, request):
    cats = [r[0] for r in db.execute("SELECT DISTINCT category FROM wiki_pages ORDER BY category")] + ["Landmarks"]
    flash, values = "", {}
    if request.method == "POST":
        values = {k: str(v).strip()[:5000] for k, v in (await read_form(request)).items()}
        title = values.get("title", "")[:200]
        if title and one(db, "SELECT id FROM wiki_pages WHERE slug=? OR title=?", slugify(title), title) is None:
            db.execute(
                "INSERT INTO wiki_pages(slug, title, category, body) VALUES (?,?,?,?)",
                (slugify(title), title, values.get("category") or "Uncategorized", values.get("body", "")),
            )
            return redirect(f"/wiki/page/{slugify(title)}")
        flash = "A page needs a title that no page has yet."
    fields = [
        {"name": "title", "label": "Title", "value": values.get("title", "")},
        {
            "name": "category",
            "label": "Category",
            "kind": "select",
            "value": values.get("category"),
            "options": [(c, c) for c in sorted(set(cats))],
        },
        {"name": "body", "label": "Page text", "kind": "textarea", "value": values.get("body", "")},
    ]
    return render(
        "wiki", "form.html", "Create a page", fields=fields, button="Create page", flash=flash, action="/wiki/new"
    )
