"""The forum (/forum, Postmill-like): forums, posts sorted hot/new/top, comments, votes and new posts. The persona
votes and writes as `FORUM_USER`; a vote toggles (a second click on the same arrow takes it back), and a shown
score is the stored score plus the persona's vote.
"""

from __future__ import annotations

from esopt.envs.web.pages import not_found, one, read_form, redirect, render, rows, to_int
from esopt.envs.web.world import FORUM_USER

POST_SORTS = {
    "hot": "p.score * 1.0 / (julianday('2026-01-15') - julianday(p.created) + 2) DESC",
    "new": "p.created DESC, p.id DESC",
    "top": "p.score DESC",
}


def _votes(db, kind: str) -> dict[int, int]:
    return dict(db.execute("SELECT target, value FROM votes WHERE user=? AND kind=?", (FORUM_USER, kind)).fetchall())


def _posts(db, where: str, args: tuple, sort: str) -> list[dict]:
    mine = _votes(db, "post")
    found = rows(
        db,
        "SELECT p.*, f.name AS forum, (SELECT COUNT(*) FROM comments c WHERE c.post_id=p.id) AS comments "
        f"FROM posts p JOIN forums f ON f.id=p.forum_id WHERE {where} ORDER BY {POST_SORTS[sort]}",
        *args,
    )
    for p in found:
        p["vote"] = mine.get(p["id"], 0)
        p["score"] += p["vote"]
    return found


def forum_home(db, request):
    forums = rows(
        db,
        "SELECT f.name, f.description, (SELECT COUNT(*) FROM posts p WHERE p.forum_id=f.id) AS n "
        "FROM forums f ORDER BY f.name",
    )
    table = [[{"text": f["name"], "href": f"/forum/f/{f['name']}"}, f["description"], f["n"]] for f in forums]
    return render("forum", "table.html", "Forums", header=["Forum", "Description", "Posts"], rows=table)


def forum_list(db, request):
    name = request.path_params["name"]
    forum = one(db, "SELECT * FROM forums WHERE name=?", name)
    if forum is None:
        return not_found("forum", f"Forum {name}")
    sort = request.query_params.get("sort", "hot")
    sort = sort if sort in POST_SORTS else "hot"
    sorts = [(s.capitalize(), f"/forum/f/{name}?sort={s}") for s in POST_SORTS]
    return render(
        "forum",
        "forum_list.html",
        f"/f/{name}",
        description=forum["description"],
        sorts=sorts,
        posts=_posts(db, "p.forum_id=?", (forum["id"],), sort),
        here=f"/forum/f/{name}?sort={sort}",
    )


def forum_post(db, request):
    pid = to_int(request.path_params["pid"], -1)
    found = _posts(db, "p.id=?", (pid,), "new")
    if not found:
        return not_found("forum", "This post")
    mine = _votes(db, "comment")
    comments = rows(db, "SELECT * FROM comments WHERE post_id=? ORDER BY score DESC, id", pid)
    for c in comments:
        c["vote"] = mine.get(c["id"], 0)
        c["score"] += c["vote"]
    return render(
        "forum", "forum_post.html", found[0]["title"], p=found[0], comments=comments, here=f"/forum/post/{pid}"
    )


async def forum_vote(db, request):
    form = await read_form(request)
    kind, target, value = form.get("kind"), to_int(form.get("target"), -1), to_int(form.get("dir"), 0)
    nxt = str(form.get("next", "/forum/"))
    nxt = nxt if nxt.startswith("/forum/") else "/forum/"
    if kind in ("post", "comment") and value in (1, -1):
        table = "posts" if kind == "post" else "comments"
        if one(db, f"SELECT id FROM {table} WHERE id=?", target) is not None:
            old = _votes(db, kind).get(target, 0)
            db.execute(
                "INSERT OR REPLACE INTO votes VALUES (?,?,?,?)",
                (FORUM_USER, kind, target, 0 if old == value else value),
            )
    return redirect(nxt)


async def forum_comment(db, request):
    pid = to_int(request.path_params["pid"], -1)
    body = str((await read_form(request)).get("body", "")).strip()[:2000]
    if one(db, "SELECT id FROM posts WHERE id=?", pid) is None:
        return not_found("forum", "This post")
    if body:
        db.execute(
            "INSERT INTO comments(post_id, author, body, score, created) VALUES (?,?,?,?,?)",
            (pid, FORUM_USER, body, 1, "2026-01-15"),
        )
    return redirect(f"/forum/post/{pid}")


async def forum_submit(db, request):
    forums = [r[0] for r in db.execute("SELECT name FROM forums ORDER BY name")]
    flash, values = "", {}
    if request.method == "POST":
        values = {k: str(v).strip()[:2000] for k, v in (await read_form(request)).items()}
        forum = one(db, "SELECT id FROM forums WHERE name=?", values.get("forum", ""))
        taken = one(db, "SELECT id FROM posts WHERE title=?", values.get("title", ""))
        if forum and values.get("title") and not taken:
            cur = db.execute(
                "INSERT INTO posts(forum_id, author, title, body, score, created) VALUES (?,?,?,?,?,?)",
                (forum["id"], FORUM_USER, values["title"][:300], values.get("body", ""), 1, "2026-01-15"),
            )
            return redirect(f"/forum/post/{cur.lastrowid}")
        flash = "A post needs a forum and a title not used before."
    fields = [
        {
            "name": "forum",
            "label": "Forum",
            "kind": "select",
            "value": values.get("forum"),
            "options": [("", "Choose one")] + [(f, f) for f in forums],
        },
        {"name": "title", "label": "Title", "value": values.get("title", "")},
        {"name": "body", "label": "Body", "kind": "textarea", "value": values.get("body", "")},
    ]
    return render(
        "forum",
        "form.html",
        "Submit a new post",
        fields=fields,
        button="Create post",
        flash=flash,
        action="/forum/submit",
    )
