"""Task templates of the shop (__SHOPPING__) and its admin (__SHOPPING_ADMIN__). Each returns `spec(...)`; the
answers come from the template database, so they are right by construction."""

from __future__ import annotations

from esopt.envs.web.tasks import DONE, answer, click, db_check, fill, page_check, pick, select, spec, template
from esopt.envs.web.world import CATEGORIES, ORDER_STATUSES, PERSONA_ID, SHIPPING, money, slugify

P = "SELECT * FROM products WHERE enabled=1 ORDER BY id"
MY_ORDERS = f"SELECT * FROM orders WHERE customer_id={PERSONA_ID} ORDER BY id"
NOT_IN_CART = ("SELECT * FROM products WHERE id NOT IN "
               f"(SELECT product_id FROM cart_items WHERE customer_id={PERSONA_ID}) ORDER BY id")
IN_CART = (f"SELECT p.*, c.qty FROM products p JOIN cart_items c ON c.product_id=p.id WHERE c.customer_id={PERSONA_ID} "
           "ORDER BY p.id")


def find_product(name: str) -> list[list]:
    return [fill("searchbox", "Search products", name), click("button", "Search"), click("link", name)]


# ---------------------------------------------------------------- tier 1: the answer is on the start page
@template("shop", 1, "train", "What is the price of {{product}}?")
def shop_price(db, rng):
    p = pick(db, rng, P)
    return spec(
        {"product": p["name"]},
        f"__SHOPPING__/product/{p['id']}",
        [answer(money(p["price_cents"]))],
        exact=money(p["price_cents"]),
    )


@template("shop", 1, "validation", "What is the SKU of {{product}}?")
def shop_sku(db, rng):
    p = pick(db, rng, P)
    return spec({"product": p["name"]}, f"__SHOPPING__/product/{p['id']}", [answer(p["sku"])], exact=p["sku"])


@template("shop", 1, "test", "How many reviews does {{product}} have?")
def shop_review_count(db, rng):
    p = pick(db, rng, P)
    n = db.execute("SELECT COUNT(*) FROM reviews WHERE product_id=?", (p["id"],)).fetchone()[0]
    return spec({"product": p["name"]}, f"__SHOPPING__/product/{p['id']}", [answer(n)], exact=n)


@template("shop", 1, "train", "What is the subtotal of {{product}} in my cart?")
def shop_cart_subtotal(db, rng):
    p = pick(db, rng, IN_CART)
    value = money(p["price_cents"] * p["qty"])
    return spec({"product": p["name"]}, "__SHOPPING__/cart", [answer(value)], exact=value)


@template("shop", 1, "train", "What was the total of my order #{{order}}?")
def shop_order_total(db, rng):
    o = pick(db, rng, MY_ORDERS)
    return spec(
        {"order": o["id"]}, "__SHOPPING__/orders", [answer(money(o["total_cents"]))], exact=money(o["total_cents"])
    )


@template("shop", 1, "train", "What is the status of my order #{{order}}?")
def shop_order_status(db, rng):
    o = pick(db, rng, MY_ORDERS)
    return spec({"order": o["id"]}, "__SHOPPING__/orders", [answer(o["status"])], exact=o["status"])


# ---------------------------------------------------------------- tier 2: two or three pages
@template("shop", 2, "train", "What is the cheapest product in the {{category}} category?")
def shop_cheapest(db, rng):
    category = rng.choice(list(CATEGORIES))
    p = dict(
        db.execute("SELECT * FROM products WHERE enabled=1 AND category=? ORDER BY price_cents", (category,)).fetchone()
    )
    return spec(
        {"category": category},
        "__SHOPPING__/",
        [click("link", category), click("link", "Price: low to high"), answer(p["name"])],
        exact=p["name"],
    )


@template("shop", 2, "train", "How much does the {{product}} cost?")
def shop_search_price(db, rng):
    p = pick(db, rng, P)
    value = money(p["price_cents"])
    return spec({"product": p["name"]}, "__SHOPPING__/", find_product(p["name"])[:2] + [answer(value)], exact=value)


@template("shop", 2, "validation", "Who wrote the lowest-rated review of {{product}}?")
def shop_lowest_review(db, rng):
    candidates = [
        dict(r)
        for r in db.execute(
            "SELECT p.id, p.name, r.author FROM products p JOIN reviews r ON r.product_id=p.id WHERE r.rating = "
            "(SELECT MIN(rating) FROM reviews WHERE product_id=p.id) AND (SELECT COUNT(*) FROM reviews x WHERE "
            "x.product_id=p.id AND x.rating=r.rating)=1 ORDER BY p.id"
        )
    ]
    p = rng.choice(candidates)
    return spec(
        {"product": p["name"]}, "__SHOPPING__/", find_product(p["name"]) + [answer(p["author"])], exact=p["author"]
    )


@template("shop", 2, "test", "How many units of {{product}} did I buy in my order #{{order}}?")
def shop_order_units(db, rng):
    o = pick(db, rng, MY_ORDERS)
    item = pick(
        db,
        rng,
        "SELECT p.name, i.qty FROM order_items i JOIN products p ON p.id=i.product_id WHERE i.order_id=? ORDER BY p.id",
        o["id"],
    )
    return spec(
        {"product": item["name"], "order": o["id"]},
        "__SHOPPING__/",
        [click("link", "My orders"), click("link", f"Order #{o['id']}"), answer(item["qty"])],
        exact=item["qty"],
    )


@template("shop", 2, "train", "Add {{product}} to my cart.")
def shop_add_to_cart(db, rng):
    p = pick(db, rng, NOT_IN_CART + "")
    return spec(
        {"product": p["name"]},
        "__SHOPPING__/",
        find_product(p["name"]) + [click("button", "Add to cart"), DONE],
        program=[
            db_check("cart_qty", 1, product_id=p["id"]),
            page_check("__SHOPPING__/cart", "table", include=[p["name"]]),
        ],
    )


@template("shop", 2, "validation", "Remove {{product}} from my cart.")
def shop_remove_from_cart(db, rng):
    p = pick(db, rng, IN_CART)
    others = db.execute(
        "SELECT SUM(qty) FROM cart_items WHERE customer_id=? AND product_id!=?", (PERSONA_ID, p["id"])
    ).fetchone()[0]
    return spec(
        {"product": p["name"]},
        "__SHOPPING__/",
        [click("link", "My cart"), click("button", f"Remove {p['name']}"), DONE],
        program=[db_check("cart_qty", 0, product_id=p["id"]), db_check("cart_qty_except", others, product_id=p["id"])],
    )


@template("shop", 2, "test", "Show me the products of the {{category}} category sorted by price from high to low.")
def shop_sorted_category(db, rng):
    category = rng.choice(list(CATEGORIES))
    return spec(
        {"category": category},
        "__SHOPPING__/",
        [click("link", category), click("link", "Price: high to low"), DONE],
        url=f"__SHOPPING__/category/{slugify(category)}?sort=price_desc",
    )


@template("shop", 2, "train", "Cancel my order #{{order}}.")
def shop_cancel_order(db, rng):
    o = pick(db, rng, MY_ORDERS.replace("ORDER BY", "AND status='pending' ORDER BY"))
    return spec(
        {"order": o["id"]},
        "__SHOPPING__/",
        [click("link", "My orders"), click("link", f"Order #{o['id']}"), click("button", "Cancel order"), DONE],
        program=[db_check("order_status", "canceled", order_id=o["id"])],
    )


# ---------------------------------------------------------------- tier 3: several pages and a form
@template("shop", 3, "train", "Buy {{qty}} of {{product}} with {{shipping}} shipping to {{street}}, {{city}} {{zip}}.")
def shop_checkout(db, rng):
    p = pick(db, rng, NOT_IN_CART.replace("ORDER BY", "AND stock > 0 AND enabled=1 ORDER BY"))
    qty, shipping = rng.randint(2, 4), rng.choice(list(SHIPPING))
    street, city, zip_code = (
        f"{rng.randint(2, 99)} Harbor Rd",
        rng.choice(("Ashford", "Oakdale", "Fairview")),
        str(rng.randint(10000, 99999)),
    )
    after = db.execute("SELECT MAX(id) FROM orders").fetchone()[0]
    oracle = find_product(p["name"]) + [
        fill("spinbutton", "Quantity", qty),
        click("button", "Add to cart"),
        click("link", "Proceed to checkout"),
        fill("textbox", "Street", street),
        fill("textbox", "City", city),
        fill("textbox", "ZIP code", zip_code),
        select("combobox", "Shipping method", f"{shipping} ({money(SHIPPING[shipping])})"),
        click("button", "Place order"),
        DONE,
    ]
    program = [
        db_check("new_order_qty", qty, after=after, product_id=p["id"]),
        db_check("new_order_field", shipping, after=after, field="shipping"),
        db_check("new_order_field", street, after=after, field="ship_street"),
        db_check("new_order_field", city, after=after, field="ship_city"),
        db_check("new_order_field", zip_code, after=after, field="ship_zip"),
    ]
    return spec(
        {"qty": qty, "product": p["name"], "shipping": shipping, "street": street, "city": city, "zip": zip_code},
        "__SHOPPING__/",
        oracle,
        program=program,
    )


@template(
    "shop", 3, "validation", "Write a {{rating}}-star review of {{product}} titled '{{title}}' that says '{{text}}'."
)
def shop_write_review(db, rng):
    p = pick(db, rng, P)
    rating, title = rng.randint(1, 5), rng.choice(("Solid buy", "Not for me", "Better than expected", "Just okay"))
    text = rng.choice(("It arrived on time.", "The color is nice.", "Easy to use.", "A bit noisy."))
    oracle = find_product(p["name"]) + [
        click("link", "Write a review"),
        fill("textbox", "Review title", title),
        select("combobox", "Rating", f"{rating} stars"),
        fill("textbox", "Your review", text),
        click("button", "Submit review"),
        DONE,
    ]
    program = [
        db_check("my_review", rating, product_id=p["id"], field="rating"),
        db_check("my_review", title, product_id=p["id"], field="title"),
        db_check("my_review", text, product_id=p["id"], field="body"),
    ]
    return spec(
        {"rating": rating, "product": p["name"], "title": title, "text": text}, "__SHOPPING__/", oracle, program=program
    )


@template("shop", 3, "test", "Change the quantity of {{product}} in my cart to {{qty}}.")
def shop_cart_quantity(db, rng):
    p = pick(db, rng, IN_CART)
    qty = rng.choice([q for q in range(2, 7) if q != p["qty"]])
    others = db.execute(
        "SELECT SUM(qty) FROM cart_items WHERE customer_id=? AND product_id!=?", (PERSONA_ID, p["id"])
    ).fetchone()[0]
    oracle = [
        click("link", "My cart"),
        fill("spinbutton", f"Quantity of {p['name']}", qty),
        click("button", "Update cart"),
        DONE,
    ]
    return spec(
        {"product": p["name"], "qty": qty},
        "__SHOPPING__/",
        oracle,
        program=[
            db_check("cart_qty", qty, product_id=p["id"]),
            db_check("cart_qty_except", others, product_id=p["id"]),
        ],
    )


@template("shop", 3, "train", "Add {{qty}} units of the cheapest product of the {{category}} category to my cart.")
def shop_add_cheapest(db, rng):
    category = rng.choice(list(CATEGORIES))
    p = dict(
        db.execute("SELECT * FROM products WHERE enabled=1 AND category=? ORDER BY price_cents", (category,)).fetchone()
    )
    qty = rng.randint(2, 5)
    have = db.execute(
        "SELECT qty FROM cart_items WHERE customer_id=? AND product_id=?", (PERSONA_ID, p["id"])
    ).fetchone()
    oracle = [
        click("link", category),
        click("link", "Price: low to high"),
        click("link", p["name"]),
        fill("spinbutton", "Quantity", qty),
        click("button", "Add to cart"),
        DONE,
    ]
    return spec(
        {"qty": qty, "category": category},
        "__SHOPPING__/",
        oracle,
        program=[db_check("cart_qty", qty + (have[0] if have else 0), product_id=p["id"])],
    )


# ---------------------------------------------------------------- admin
C = "SELECT * FROM customers ORDER BY id"


@template("admin", 1, "train", "What is the email address of the customer {{customer}}?")
def admin_customer_email(db, rng):
    c = pick(db, rng, C)
    return spec(
        {"customer": c["name"]},
        f"__SHOPPING_ADMIN__/customers?q={c['name'].split()[1]}",
        [answer(c["email"])],
        exact=c["email"],
    )


@template("admin", 1, "validation", "How many units of {{product}} are in stock?")
def admin_stock(db, rng):
    p = pick(db, rng, "SELECT * FROM products ORDER BY id")
    return spec(
        {"product": p["name"]},
        f"__SHOPPING_ADMIN__/products?q={p['name'].split()[0]}",
        [answer(p["stock"])],
        exact=p["stock"],
    )


@template("admin", 1, "test", "Which customer placed order #{{order}}?")
def admin_order_customer(db, rng):
    o = pick(db, rng, "SELECT o.id, c.name FROM orders o JOIN customers c ON c.id=o.customer_id ORDER BY o.id")
    return spec({"order": o["id"]}, f"__SHOPPING_ADMIN__/order/{o['id']}", [answer(o["name"])], exact=o["name"])


def _latest_order(db, customer_id: int) -> dict:
    return dict(
        db.execute("SELECT * FROM orders WHERE customer_id=? ORDER BY created DESC, id DESC", (customer_id,)).fetchone()
    )


def find_customer(name: str) -> list[list]:
    return [
        click("link", "Customers"),
        fill("textbox", "Name or email", name),
        click("button", "Search"),
        click("link", name),
    ]


WITH_ORDERS = "SELECT * FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id=c.id) ORDER BY id"


@template("admin", 2, "train", "What is the status of the most recent order of {{customer}}?")
def admin_latest_status(db, rng):
    c = pick(db, rng, WITH_ORDERS)
    o = _latest_order(db, c["id"])
    return spec(
        {"customer": c["name"]},
        "__SHOPPING_ADMIN__/",
        find_customer(c["name"]) + [answer(o["status"])],
        exact=o["status"],
    )


@template("admin", 2, "validation", "How many orders has {{customer}} placed?")
def admin_order_count(db, rng):
    c = pick(db, rng, C)
    n = db.execute("SELECT COUNT(*) FROM orders WHERE customer_id=?", (c["id"],)).fetchone()[0]
    return spec({"customer": c["name"]}, "__SHOPPING_ADMIN__/", find_customer(c["name"])[:3] + [answer(n)], exact=n)


@template("admin", 2, "test", "How many orders have the status {{status}}?")
def admin_status_count(db, rng):
    status = rng.choice(ORDER_STATUSES)
    n = db.execute("SELECT COUNT(*) FROM orders WHERE status=?", (status,)).fetchone()[0]
    return spec(
        {"status": status},
        "__SHOPPING_ADMIN__/",
        [click("link", "Orders"), select("combobox", "Status", status), click("button", "Filter"), answer(n)],
        exact=n,
    )


def edit_product(name: str) -> list[list]:
    return [
        click("link", "Products"),
        fill("textbox", "Name or SKU", name),
        click("button", "Search"),
        click("link", name),
    ]


@template("admin", 3, "train", "Set the price of {{product}} to {{price}}.")
def admin_set_price(db, rng):
    p = pick(db, rng, "SELECT * FROM products ORDER BY id")
    cents = rng.choice([c for c in range(999, 30000, 250) if c != p["price_cents"]])
    oracle = edit_product(p["name"]) + [
        fill("textbox", "Price", f"{cents / 100:.2f}"),
        click("button", "Save product"),
        DONE,
    ]
    return spec(
        {"product": p["name"], "price": money(cents)},
        "__SHOPPING_ADMIN__/",
        oracle,
        program=[
            db_check("product_field", f"{cents / 100:.2f}", product_id=p["id"], field="price"),
            db_check("product_field", p["stock"], product_id=p["id"], field="stock"),
        ],
    )


@template("admin", 3, "validation", "Disable the product {{product}} so that it no longer shows in the shop.")
def admin_disable_product(db, rng):
    p = pick(db, rng, P)
    oracle = edit_product(p["name"]) + [["uncheck", "checkbox", "Enabled"], click("button", "Save product"), DONE]
    return spec(
        {"product": p["name"]},
        "__SHOPPING_ADMIN__/",
        oracle,
        program=[
            db_check("product_field", 0, product_id=p["id"], field="enabled"),
            db_check("product_field", f"{p['price_cents'] / 100:.2f}", product_id=p["id"], field="price"),
        ],
    )


@template("admin", 3, "test", "Set the stock of the product with SKU {{sku}} to {{stock}} units.")
def admin_set_stock(db, rng):
    p = pick(db, rng, "SELECT * FROM products ORDER BY id")
    stock = rng.choice([s for s in range(0, 80, 5) if s != p["stock"]])
    oracle = [
        click("link", "Products"),
        fill("textbox", "Name or SKU", p["sku"]),
        click("button", "Search"),
        click("link", p["name"]),
        fill("spinbutton", "Quantity in stock", stock),
        click("button", "Save product"),
        DONE,
    ]
    return spec(
        {"sku": p["sku"], "stock": stock},
        "__SHOPPING_ADMIN__/",
        oracle,
        program=[
            db_check("product_field", stock, product_id=p["id"], field="stock"),
            db_check("product_field", 1 if p["enabled"] else 0, product_id=p["id"], field="enabled"),
        ],
    )


@template("admin", 3, "train", "Change the status of the most recent order of {{customer}} to {{status}}.")
def admin_update_status(db, rng):
    c = pick(db, rng, WITH_ORDERS)
    o = _latest_order(db, c["id"])
    status = rng.choice([s for s in ORDER_STATUSES if s != o["status"]])
    oracle = find_customer(c["name"]) + [
        click("link", f"Order #{o['id']}"),
        select("combobox", "Order status", status),
        click("button", "Update status"),
        DONE,
    ]
    return spec(
        {"customer": c["name"], "status": status},
        "__SHOPPING_ADMIN__/",
        oracle,
        program=[db_check("order_status", status, order_id=o["id"])],
    )


MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


@template("admin", 3, "train", "What was the revenue of {{status}} orders from {{start}} to {{end}}?")
def admin_report_revenue(db, rng):
    status = rng.choice(ORDER_STATUSES)
    m1 = rng.randint(1, 10)
    m2 = rng.randint(m1 + 1, 12)
    start, end = f"2025-{m1:02d}-01", f"2025-{m2:02d}-28"
    cents = db.execute(
        "SELECT COALESCE(SUM(total_cents), 0) FROM orders WHERE created>=? AND created<=? AND status=?",
        (start, end, status),
    ).fetchone()[0]
    oracle = [
        click("link", "Reports"),
        fill("textbox", "From date", start),
        fill("textbox", "To date", end),
        select("combobox", "Status", status),
        click("button", "Show report"),
        answer(money(cents)),
    ]
    return spec({"status": status, "start": start, "end": end}, "__SHOPPING_ADMIN__/", oracle, exact=money(cents))


@template("admin", 3, "test", "Which product sold the most units in {{month}} 2025, counting orders of any status?")
def admin_report_bestseller(db, rng):
    months = []
    for m in range(1, 13):
        top = db.execute(
            "SELECT p.name, SUM(i.qty) AS u FROM order_items i JOIN orders o ON o.id=i.order_id JOIN products p "
            "ON p.id=i.product_id WHERE substr(o.created, 1, 7)=? GROUP BY p.id ORDER BY u DESC LIMIT 2",
            (f"2025-{m:02d}",),
        ).fetchall()
        if len(top) == 2 and top[0][1] > top[1][1]:
            months.append((m, top[0][0]))
    m, name = rng.choice(months)
    oracle = [
        click("link", "Reports"),
        fill("textbox", "From date", f"2025-{m:02d}-01"),
        fill("textbox", "To date", f"2025-{m:02d}-31"),
        click("button", "Show report"),
        answer(name),
    ]
    return spec({"month": MONTHS[m - 1]}, "__SHOPPING_ADMIN__/", oracle, exact=name)
