"""Task templates of the forum (__REDDIT__)."""

from __future__ import annotations

from esopt.envs.web.tasks import DONE, answer, click, db_check, fill, page_check, pick, select, spec, template
from esopt.envs.web.world import FORUMS

POSTS = "SELECT p.*, f.name AS forum FROM posts p JOIN forums f ON f.id=p.forum_id ORDER BY p.id"
COMMENT_COUNT = "(SELECT COUNT(*) FROM comments c WHERE c.post_id=p.id)"
REPLIES = (
    "Thanks, this is useful.",
    "I had the same problem last week.",
    "Great post, saving it.",
    "Could you share more details?",
)


@template("forum", 1, "train", "Who submitted the post '{{title}}'?")
def forum_post_author(db, rng):
    p = pick(db, rng, POSTS)
    return spec({"title": p["title"]}, f"__REDDIT__/post/{p['id']}", [answer(p["author"])], exact=p["author"])


@template("forum", 1, "validation", "How many comments does the post '{{title}}' have?")
def forum_comment_count(db, rng):
    p = pick(db, rng, POSTS.replace("ORDER BY", f"AND {COMMENT_COUNT} > 0 ORDER BY"))
    n = db.execute("SELECT COUNT(*) FROM comments WHERE post_id=?", (p["id"],)).fetchone()[0]
    return spec({"title": p["title"]}, f"__REDDIT__/post/{p['id']}", [answer(n)], exact=n)


@template("forum", 1, "test", "What is the score of the post '{{title}}'?")
def forum_post_score(db, rng):
    p = pick(db, rng, POSTS)
    return spec({"title": p["title"]}, f"__REDDIT__/post/{p['id']}", [answer(p["score"])], exact=p["score"])


@template("forum", 2, "train", "What is the title of the highest-scoring post in the {{forum}} forum?")
def forum_top_post(db, rng):
    forum = rng.choice(list(FORUMS))
    title = db.execute(
        "SELECT p.title FROM posts p JOIN forums f ON f.id=p.forum_id WHERE f.name=? ORDER BY p.score DESC", (forum,)
    ).fetchone()[0]
    return spec(
        {"forum": forum}, "__REDDIT__/", [click("link", forum), click("link", "Top"), answer(title)], exact=title
    )


@template("forum", 2, "train", "Upvote the post '{{title}}' in the {{forum}} forum.")
def forum_upvote(db, rng):
    p = pick(db, rng, POSTS)
    return spec(
        {"title": p["title"], "forum": p["forum"]},
        "__REDDIT__/",
        [click("link", p["forum"]), click("button", "Upvote", near=p["title"]), DONE],
        program=[db_check("my_vote", 1, kind="post", target=p["id"])],
    )


TWO_COMMENTS = POSTS.replace("ORDER BY", f"AND {COMMENT_COUNT} >= 2 ORDER BY")


@template("forum", 2, "validation", "Who wrote the highest-scoring comment on the post '{{title}}'?")
def forum_top_comment(db, rng):
    p = pick(db, rng, TWO_COMMENTS)
    author = db.execute("SELECT author FROM comments WHERE post_id=? ORDER BY score DESC", (p["id"],)).fetchone()[0]
    return spec(
        {"title": p["title"]}, f"__REDDIT__/f/{p['forum']}", [click("link", p["title"]), answer(author)], exact=author
    )


@template("forum", 2, "test", "Downvote the comment by {{author}} on the post '{{title}}'.")
def forum_downvote_comment(db, rng):
    c = pick(
        db,
        rng,
        "SELECT c.id, c.author, p.title, f.name AS forum FROM comments c JOIN posts p ON p.id=c.post_id "
        "JOIN forums f ON f.id=p.forum_id WHERE (SELECT COUNT(*) FROM comments d WHERE d.post_id=c.post_id "
        "AND d.author=c.author)=1 ORDER BY c.id",
    )
    return spec(
        {"author": c["author"], "title": c["title"]},
        f"__REDDIT__/f/{c['forum']}",
        [click("link", c["title"]), click("button", "Downvote", near=f"{c['author']} wrote"), DONE],
        program=[db_check("my_vote", -1, kind="comment", target=c["id"])],
    )


@template("forum", 3, "train", "Create a post in the {{forum}} forum titled '{{title}}' with the text '{{text}}'.")
def forum_new_post(db, rng):
    forum = rng.choice(list(FORUMS))
    title = f"{rng.choice(('Quick question', 'My weekend', 'A small win', 'Looking for advice'))} about {forum}"
    text = rng.choice(("Has anyone tried this?", "Here is what I learned.", "Curious what you think."))
    oracle = [
        click("link", "Submit a post"),
        select("combobox", "Forum", forum),
        fill("textbox", "Title", title),
        fill("textbox", "Body", text),
        click("button", "Create post"),
        DONE,
    ]
    return spec(
        {"forum": forum, "title": title, "text": text},
        "__REDDIT__/",
        oracle,
        program=[
            page_check("last", "h1", exact=title),
            db_check("my_post", forum, title=title, field="forum"),
            db_check("my_post", text, title=title, field="body"),
        ],
    )


@template("forum", 3, "validation", "Reply to the post '{{title}}' with the comment '{{text}}'.")
def forum_reply(db, rng):
    p = pick(db, rng, POSTS)
    text = rng.choice(REPLIES)
    oracle = [click("link", p["title"]), fill("textbox", "Your comment", text), click("button", "Post comment"), DONE]
    return spec(
        {"title": p["title"], "text": text},
        f"__REDDIT__/f/{p['forum']}",
        oracle,
        program=[db_check("my_comments", text, post_id=p["id"])],
    )


@template("forum", 3, "test", "Find the highest-scoring post in the {{forum}} forum and comment '{{text}}' on it.")
def forum_comment_top(db, rng):
    forum = rng.choice(list(FORUMS))
    p = dict(
        db.execute(
            "SELECT p.* FROM posts p JOIN forums f ON f.id=p.forum_id WHERE f.name=? ORDER BY p.score DESC", (forum,)
        ).fetchone()
    )
    text = rng.choice(REPLIES)
    oracle = [
        click("link", forum),
        click("link", "Top"),
        click("link", p["title"]),
        fill("textbox", "Your comment", text),
        click("button", "Post comment"),
        DONE,
    ]
    return spec(
        {"forum": forum, "text": text}, "__REDDIT__/", oracle, program=[db_check("my_comments", text, post_id=p["id"])]
    )
