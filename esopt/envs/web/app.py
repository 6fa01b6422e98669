"""The four sites as one Starlette app: the shop (/shop), its admin (/admin), a forum (/forum) and a wiki (/wiki).

Every request belongs to an episode, named by the `esopt_episode` cookie; each episode owns an in-memory copy of
the template database (`world.copy_db`, sqlite's backup API), made when the env resets it, so episodes never share
state and a reset takes about a millisecond. The cookie is the login too: the persona is signed in to every site.
Control routes under /_esopt (linked from no page; the text browser refuses them): POST /_esopt/episodes/{id}
creates an episode (`?drop=OLD` drops the env's previous one in the same request), DELETE drops one, GET
/_esopt/episodes/{id}/db returns its database (sqlite's serialized form) for the evaluators. Handlers are `async`
and touch only their episode's database, so the event loop's one thread serializes them: no locks.
No JavaScript anywhere.
"""

from __future__ import annotations

import collections
import inspect
import re

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from esopt.envs.web import forum, shop, wiki, world
from esopt.envs.web.pages import render

COOKIE = "esopt_episode"
MAX_EPISODES = 512  # past this the oldest are dropped (envs that died without closing their episode)
EPISODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
GET, POST, BOTH = ["GET"], ["POST"], ["GET", "POST"]
PAGES = [
    ("/shop/", shop.shop_home, GET),
    ("/shop/search", shop.shop_search, GET),
    ("/shop/category/{slug}", shop.shop_category, GET),
    ("/shop/product/{pid}", shop.shop_product, GET),
    ("/shop/product/{pid}/review", shop.shop_review, BOTH),
    ("/shop/cart", shop.shop_cart, GET),
    ("/shop/cart/add", shop.shop_cart_add, POST),
    ("/shop/cart/update", shop.shop_cart_update, POST),
    ("/shop/cart/remove", shop.shop_cart_remove, POST),
    ("/shop/checkout", shop.shop_checkout, BOTH),
    ("/shop/orders", shop.shop_orders, GET),
    ("/shop/order/{oid}", shop.shop_order, GET),
    ("/shop/order/{oid}/cancel", shop.shop_order_cancel, POST),
    ("/admin/", shop.admin_home, GET),
    ("/admin/orders", shop.admin_orders, GET),
    ("/admin/order/{oid}", shop.admin_order, GET),
    ("/admin/order/{oid}/status", shop.admin_order_status, POST),
    ("/admin/customers", shop.admin_customers, GET),
    ("/admin/customer/{cid}", shop.admin_customer, GET),
    ("/admin/products", shop.admin_products, GET),
    ("/admin/product/{pid}/edit", shop.admin_product_edit, BOTH),
    ("/admin/reports", shop.admin_reports, GET),
    ("/forum/", forum.forum_home, GET),
    ("/forum/f/{name}", forum.forum_list, GET),
    ("/forum/post/{pid}", forum.forum_post, GET),
    ("/forum/vote", forum.forum_vote, POST),
    ("/forum/post/{pid}/comment", forum.forum_comment, POST),
    ("/forum/submit", forum.forum_submit, BOTH),
    ("/wiki/", wiki.wiki_home, GET),
    ("/wiki/search", wiki.wiki_search, GET),
    ("/wiki/page/{slug}", wiki.wiki_page, GET),
    ("/wiki/page/{slug}/edit", wiki.wiki_edit, BOTH),
    ("/wiki/category/{cat}", wiki.wiki_category, GET),
    ("/wiki/new", wiki.wiki_new, BOTH),
]


def make_app(data_seed: int = 0) -> Starlette:
    """The app over world `data_seed`; its episodes live in this process's memory."""
    template = world.build_world(data_seed)
    episodes: collections.OrderedDict = collections.OrderedDict()

    def wrap(handler):
        site = handler.__name__.split("_")[0]

        async def endpoint(request: Request) -> Response:
            db = episodes.get(request.cookies.get(COOKIE, ""))
            if db is None:
                response = render(site, "table.html", "Signed out", lines=["No episode: the env must reset first."])
                response.status_code = 403
                return response
            result = handler(db, request)
            response = await result if inspect.isawaitable(result) else result
            db.commit()
            return response

        return endpoint

    async def episode(request: Request) -> Response:
        eid = request.path_params["eid"]
        if not EPISODE_ID.fullmatch(eid):
            return Response("bad episode id", status_code=400)
        for gone in (eid, request.query_params.get("drop", "")):  # ?drop=ID: the env's previous episode
            old = episodes.pop(gone, None)
            if old is not None:
                old.close()
        if request.method == "DELETE":
            return Response(status_code=204)
        while len(episodes) >= MAX_EPISODES:
            episodes.popitem(last=False)[1].close()
        episodes[eid] = world.copy_db(template)
        return Response(status_code=201)

    async def dump(request: Request) -> Response:
        db = episodes.get(request.path_params["eid"])
        if db is None:
            return Response("no such episode", status_code=404)
        return Response(world.dump_db(db), media_type="application/octet-stream")

    async def health(request: Request) -> Response:
        return Response(f"ok {len(episodes)} episodes", media_type="text/plain")

    async def root(request: Request) -> Response:
        return RedirectResponse("/shop/", status_code=303)

    routes = [Route(path, wrap(handler), methods=methods) for path, handler, methods in PAGES]
    routes += [
        Route("/_esopt/episodes/{eid}", episode, methods=["POST", "DELETE"]),
        Route("/_esopt/episodes/{eid}/db", dump, methods=["GET"]),
        Route("/_esopt/health", health, methods=["GET"]),
        Route("/", root, methods=["GET"]),
    ]
    return Starlette(routes=routes)
