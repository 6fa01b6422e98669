"""The shop (/shop: search, categories, product pages with reviews, cart, checkout, order history) and its admin
(/admin: orders, customers, products with editing, a sales report with filters). Handlers take the episode's
database and the request; the persona is shop customer `PERSONA_ID`.
"""

from __future__ import annotations

import sqlite3

from esopt.envs.web import world
from esopt.envs.web.pages import not_found, one, paged, read_form, redirect, render, rows, to_int
from esopt.envs.web.world import ORDER_STATUSES, PERSONA_ID, PERSONA_NAME, SHIPPING, money, slugify


def _rating(db: sqlite3.Connection, pid: int) -> str:
    avg = db.execute("SELECT AVG(rating) FROM reviews WHERE product_id=?", (pid,)).fetchone()[0]
    return f"{avg:.1f} out of 5" if avg is not None else "no reviews"


def _product_rows(db: sqlite3.Connection, where: str, args: tuple, order: str = "name") -> list[dict]:
    found = rows(db, f"SELECT * FROM products WHERE enabled=1 AND {where} ORDER BY {order}", *args)
    return [{**p, "price": money(p["price_cents"]), "rating": _rating(db, p["id"])} for p in found]


def shop_home(db, request):
    cats = [{"name": c, "slug": slugify(c)} for c in world.CATEGORIES]
    featured = _product_rows(db, "id % 9 = 2", ())
    return render("shop", "shop_home.html", "One Stop Shop", categories=cats, featured=featured)


def shop_search(db, request):
    q = request.query_params.get("q", "").strip()
    words = [w.lower() for w in q.split()][:8]
    where = " AND ".join(["(lower(name) LIKE ? OR lower(category) LIKE ?)"] * len(words)) or "1=1"
    args = tuple(x for w in words for x in (f"%{w}%", f"%{w}%"))
    return render("shop", "shop_list.html", f"Search results for '{q}'", products=_product_rows(db, where, args))


SORTS = {
    "name": ("Name", "name"),
    "price_asc": ("Price: low to high", "price_cents"),
    "price_desc": ("Price: high to low", "price_cents DESC"),
}


def shop_category(db, request):
    slug = request.path_params["slug"]
    names = {slugify(c): c for c in world.CATEGORIES}
    if slug not in names:
        return not_found("shop", f"Category {slug}")
    sort = request.query_params.get("sort", "name")
    order = SORTS.get(sort, SORTS["name"])[1]
    sorts = [(label, f"/shop/category/{slug}?sort={key}") for key, (label, _) in SORTS.items()]
    return render(
        "shop",
        "shop_list.html",
        names[slug],
        sorts=sorts,
        products=_product_rows(db, "category=?", (names[slug],), order),
    )


def _product(db, request) -> dict | None:
    p = one(db, "SELECT * FROM products WHERE id=? AND enabled=1", to_int(request.path_params["pid"], -1))
    return p and {**p, "price": money(p["price_cents"]), "rating": _rating(db, p["id"])}


def shop_product(db, request):
    p = _product(db, request)
    if p is None:
        return not_found("shop", "This product")
    reviews = rows(db, "SELECT * FROM reviews WHERE product_id=? ORDER BY created DESC, id", p["id"])
    return render("shop", "shop_product.html", p["name"], p=p, reviews=reviews)


async def shop_review(db, request):
    p = _product(db, request)
    if p is None:
        return not_found("shop", "This product")
    if request.method == "GET":
        return render("shop", "shop_review.html", f"Review {p['name']}", p=p)
    form = await read_form(request)
    rating = min(5, max(1, to_int(form.get("rating"), 5)))
    db.execute(
        "INSERT INTO reviews(product_id, author, rating, title, body, created) VALUES (?,?,?,?,?,?)",
        (
            p["id"],
            PERSONA_NAME,
            rating,
            str(form.get("title", ""))[:200],
            str(form.get("body", ""))[:2000],
            "2026-01-15",
        ),
    )
    return redirect(f"/shop/product/{p['id']}")


def _cart(db) -> tuple[list[dict], int, int]:
    items = rows(
        db,
        "SELECT p.id, p.name, p.price_cents, c.qty FROM cart_items c JOIN products p ON p.id=c.product_id "
        "WHERE c.customer_id=? ORDER BY p.name",
        PERSONA_ID,
    )
    for i in items:
        i.update(price=money(i["price_cents"]), subtotal=money(i["price_cents"] * i["qty"]))
    return items, sum(i["qty"] for i in items), sum(i["price_cents"] * i["qty"] for i in items)


def shop_cart(db, request):
    items, count, total = _cart(db)
    return render("shop", "shop_cart.html", "Shopping cart", items=items, count=count, total=money(total))


async def shop_cart_add(db, request):
    form = await read_form(request)
    pid, qty = to_int(form.get("product_id"), -1), to_int(form.get("qty"), 1)
    if one(db, "SELECT id FROM products WHERE id=? AND enabled=1", pid) is None or qty is None or qty < 1:
        return render(
            "shop", "table.html", "Could not add to cart", lines=["Choose a product and a quantity of 1 or more."]
        )
    db.execute(
        "INSERT INTO cart_items VALUES (?,?,?) ON CONFLICT(customer_id, product_id) DO UPDATE SET qty=qty+?",
        (PERSONA_ID, pid, min(qty, 99), min(qty, 99)),
    )
    return redirect("/shop/cart")


async def shop_cart_update(db, request):
    form = await read_form(request)
    for key, value in form.items():
        pid, qty = to_int(key.removeprefix("qty_")), to_int(value)
        if key.startswith("qty_") and pid is not None and qty is not None:
            if qty <= 0:
                db.execute("DELETE FROM cart_items WHERE customer_id=? AND product_id=?", (PERSONA_ID, pid))
            else:
                db.execute(
                    "UPDATE cart_items SET qty=? WHERE customer_id=? AND product_id=?", (min(qty, 99), PERSONA_ID, pid)
                )
    return redirect("/shop/cart")


async def shop_cart_remove(db, request):
    form = await read_form(request)
    db.execute(
        "DELETE FROM cart_items WHERE customer_id=? AND product_id=?", (PERSONA_ID, to_int(form.get("product_id")))
    )
    return redirect("/shop/cart")


async def shop_checkout(db, request):
    items, _, total = _cart(db)
    if not items:
        return render("shop", "table.html", "Checkout", lines=["Your cart is empty."])
    if request.method == "GET":
        shipping = [(s, money(c)) for s, c in SHIPPING.items()]
        return render(
            "shop", "shop_checkout.html", "Checkout", total=money(total), name=PERSONA_NAME, shipping=shipping
        )
    form = {k: str(v).strip()[:200] for k, v in (await read_form(request)).items()}
    missing = [
        label
        for key, label in (
            ("ship_name", "Full name"),
            ("ship_street", "Street"),
            ("ship_city", "City"),
            ("ship_zip", "ZIP code"),
        )
        if not form.get(key)
    ]
    if missing or form.get("shipping") not in SHIPPING:
        return render(
            "shop",
            "table.html",
            "Checkout failed",
            lines=[f"Missing: {', '.join(missing) or 'shipping'}."],
            links=[("Back to checkout", "/shop/checkout")],
        )
    cur = db.execute(
        "INSERT INTO orders(customer_id, created, status, shipping, ship_name, ship_street, ship_city, "
        "ship_zip, total_cents) VALUES (?,?,?,?,?,?,?,?,?)",
        (
            PERSONA_ID,
            "2026-01-15",
            "pending",
            form["shipping"],
            form["ship_name"],
            form["ship_street"],
            form["ship_city"],
            form["ship_zip"],
            total + SHIPPING[form["shipping"]],
        ),
    )
    db.executemany(
        "INSERT INTO order_items VALUES (?,?,?,?)",
        [(cur.lastrowid, i["id"], i["qty"], i["price_cents"]) for i in items],
    )
    db.execute("DELETE FROM cart_items WHERE customer_id=?", (PERSONA_ID,))
    return redirect(f"/shop/order/{cur.lastrowid}")


def _orders(db, where: str, *args) -> list[dict]:
    found = rows(db, f"SELECT * FROM orders WHERE {where} ORDER BY created DESC, id DESC", *args)
    return [{**o, "total": money(o["total_cents"])} for o in found]


def shop_orders(db, request):
    orders, pages = paged(request, _orders(db, "customer_id=?", PERSONA_ID), "/shop/orders")
    return render("shop", "shop_orders.html", "My orders", orders=orders, pages=pages, base="/shop")


def _order_page(db, request, site: str):
    oid = to_int(request.path_params["oid"], -1)
    o = one(
        db,
        "SELECT * FROM orders WHERE id=?" + (" AND customer_id=?" if site == "shop" else ""),
        *((oid, PERSONA_ID) if site == "shop" else (oid,)),
    )
    if o is None:
        return not_found(site, f"Order #{oid}")
    items = rows(
        db,
        "SELECT p.name, i.qty, i.price_cents FROM order_items i JOIN products p ON p.id=i.product_id "
        "WHERE i.order_id=?",
        oid,
    )
    for i in items:
        i["price"] = money(i["price_cents"])
    customer = one(db, "SELECT name FROM customers WHERE id=?", o["customer_id"]) if site == "admin" else None
    return render(
        site,
        "shop_order.html",
        f"Order #{oid}",
        o={**o, "total": money(o["total_cents"])},
        items=items,
        admin=site == "admin",
        statuses=ORDER_STATUSES,
        customer=customer and customer["name"],
    )


def shop_order(db, request):
    return _order_page(db, request, "shop")


async def shop_order_cancel(db, request):
    oid = to_int(request.path_params["oid"], -1)
    db.execute(
        "UPDATE orders SET status='canceled' WHERE id=? AND customer_id=? AND status='pending'", (oid, PERSONA_ID)
    )
    return redirect(f"/shop/order/{oid}")


# ---------------------------------------------------------------- admin
def admin_home(db, request):
    n, revenue = db.execute("SELECT COUNT(*), SUM(total_cents) FROM orders WHERE status != 'canceled'").fetchone()
    lines = [
        f"Orders (not canceled): {n}",
        f"Lifetime sales: {money(revenue or 0)}",
        f"Customers: {db.execute('SELECT COUNT(*) FROM customers').fetchone()[0]}",
    ]
    return render("admin", "table.html", "Dashboard", lines=lines)


def _status_field(value: str) -> dict:
    return {
        "name": "status",
        "label": "Status",
        "value": value,
        "options": [("", "Any")] + [(s, s) for s in ORDER_STATUSES],
    }


def admin_orders(db, request):
    status, q = request.query_params.get("status", ""), request.query_params.get("q", "").strip()
    where, args = "1=1", []
    if status in ORDER_STATUSES:
        where, args = "o.status=?", [status]
    if q:
        where += " AND lower(c.name) LIKE ?"
        args.append(f"%{q.lower()}%")
    found = rows(
        db,
        f"SELECT o.*, c.name AS customer FROM orders o JOIN customers c ON c.id=o.customer_id WHERE {where} "
        "ORDER BY o.id DESC",
        *args,
    )
    page, pages = paged(request, found, "/admin/orders")
    table = [
        [
            {"text": f"Order #{o['id']}", "href": f"/admin/order/{o['id']}"},
            o["created"],
            o["customer"],
            o["status"],
            money(o["total_cents"]),
        ]
        for o in page
    ]
    search = {
        "action": "/admin/orders",
        "button": "Filter",
        "fields": [{"name": "q", "label": "Customer name", "value": q}, _status_field(status)],
    }
    return render(
        "admin",
        "table.html",
        "Orders",
        search=search,
        header=["Order", "Date", "Customer", "Status", "Total"],
        rows=table,
        pages=pages,
        lines=[f"{len(found)} orders found"],
    )


def admin_order(db, request):
    return _order_page(db, request, "admin")


async def admin_order_status(db, request):
    oid, status = to_int(request.path_params["oid"], -1), (await read_form(request)).get("status")
    if status in ORDER_STATUSES:
        db.execute("UPDATE orders SET status=? WHERE id=?", (status, oid))
    return redirect(f"/admin/order/{oid}")


def admin_customers(db, request):
    q = request.query_params.get("q", "").strip()
    found = rows(
        db,
        "SELECT c.*, (SELECT COUNT(*) FROM orders o WHERE o.customer_id=c.id) AS n FROM customers c "
        "WHERE lower(c.name) LIKE ? OR lower(c.email) LIKE ? ORDER BY c.name",
        f"%{q.lower()}%",
        f"%{q.lower()}%",
    )
    page, pages = paged(request, found, "/admin/customers")
    table = [[{"text": c["name"], "href": f"/admin/customer/{c['id']}"}, c["email"], c["city"], c["n"]] for c in page]
    search = {
        "action": "/admin/customers",
        "button": "Search",
        "fields": [{"name": "q", "label": "Name or email", "value": q}],
    }
    return render(
        "admin",
        "table.html",
        "Customers",
        search=search,
        header=["Name", "Email", "City", "Orders"],
        rows=table,
        pages=pages,
    )


def admin_customer(db, request):
    c = one(db, "SELECT * FROM customers WHERE id=?", to_int(request.path_params["cid"], -1))
    if c is None:
        return not_found("admin", "This customer")
    orders = _orders(db, "customer_id=?", c["id"])
    table = [
        [{"text": f"Order #{o['id']}", "href": f"/admin/order/{o['id']}"}, o["created"], o["status"], o["total"]]
        for o in orders
    ]
    lines = [f"Email: {c['email']}", f"City: {c['city']}", f"Customer since: {c['joined']}", f"Orders: {len(orders)}"]
    return render(
        "admin", "table.html", c["name"], lines=lines, header=["Order", "Date", "Status", "Total"], rows=table
    )


def admin_products(db, request):
    q = request.query_params.get("q", "").strip()
    found = rows(
        db,
        "SELECT * FROM products WHERE lower(name) LIKE ? OR lower(sku) LIKE ? ORDER BY sku",
        f"%{q.lower()}%",
        f"%{q.lower()}%",
    )
    page, pages = paged(request, found, "/admin/products")
    table = [
        [
            p["sku"],
            {"text": p["name"], "href": f"/admin/product/{p['id']}/edit"},
            money(p["price_cents"]),
            p["stock"],
            "Enabled" if p["enabled"] else "Disabled",
        ]
        for p in page
    ]
    search = {
        "action": "/admin/products",
        "button": "Search",
        "fields": [{"name": "q", "label": "Name or SKU", "value": q}],
    }
    return render(
        "admin",
        "table.html",
        "Products",
        search=search,
        header=["SKU", "Name", "Price", "Stock", "Status"],
        rows=table,
        pages=pages,
    )


def _parse_price(text: str) -> int | None:
    try:
        value = round(float(str(text).replace("$", "").replace(",", "").strip()) * 100)
    except ValueError:
        return None
    return value if 0 <= value < 10**9 else None


async def admin_product_edit(db, request):
    p = one(db, "SELECT * FROM products WHERE id=?", to_int(request.path_params["pid"], -1))
    if p is None:
        return not_found("admin", "This product")
    flash = ""
    if request.method == "POST":
        form = await read_form(request)
        price, stock = _parse_price(form.get("price", "")), to_int(form.get("stock"))
        if price is None or stock is None or stock < 0 or not str(form.get("name", "")).strip():
            flash = "Not saved: give a name, a price like 12.50 and a stock of 0 or more."
        else:
            db.execute(
                "UPDATE products SET name=?, price_cents=?, stock=?, enabled=? WHERE id=?",
                (str(form["name"]).strip()[:200], price, stock, 1 if form.get("enabled") else 0, p["id"]),
            )
            return redirect(f"/admin/product/{p['id']}/edit?saved=1")
    flash = flash or ("You saved the product." if request.query_params.get("saved") else "")
    fields = [
        {"name": "name", "label": "Product name", "value": p["name"]},
        {"name": "price", "label": "Price", "value": f"{p['price_cents'] / 100:.2f}"},
        {"name": "stock", "label": "Quantity in stock", "value": p["stock"], "kind": "number"},
        {"name": "enabled", "label": "Enabled", "value": p["enabled"], "kind": "checkbox"},
    ]
    return render(
        "admin",
        "form.html",
        f"Edit {p['sku']}",
        fields=fields,
        button="Save product",
        flash=flash,
        action=f"/admin/product/{p['id']}/edit",
    )


def admin_reports(db, request):
    qp = request.query_params
    start, end, status = qp.get("from", "2025-01-01"), qp.get("to", "2025-12-31"), qp.get("status", "")
    where, args = "o.created >= ? AND o.created <= ?", [start, end]
    if status in ORDER_STATUSES:
        where += " AND o.status = ?"
        args.append(status)
    n, revenue = db.execute(f"SELECT COUNT(*), SUM(total_cents) FROM orders o WHERE {where}", args).fetchone()
    best = rows(
        db,
        f"SELECT p.name, SUM(i.qty) AS units FROM order_items i JOIN orders o ON o.id=i.order_id "
        f"JOIN products p ON p.id=i.product_id WHERE {where} GROUP BY p.id ORDER BY units DESC, p.name LIMIT 5",
        *args,
    )
    search = {
        "action": "/admin/reports",
        "button": "Show report",
        "fields": [
            {"name": "from", "label": "From date", "value": start},
            {"name": "to", "label": "To date", "value": end},
            _status_field(status),
        ],
    }
    lines = [
        f"Report for {start} to {end}, status {status or 'any'}",
        f"Orders: {n}",
        f"Revenue: {money(revenue or 0)}",
    ]
    return render(
        "admin",
        "table.html",
        "Sales report",
        search=search,
        lines=lines,
        header=["Bestseller", "Units sold"],
        rows=[[b["name"], b["units"]] for b in best],
    )
