"""The review console's routes: log in, the queue of flagged answers, one answer in detail, a judgement,
insights, export. Server-rendered (Jinja2, autoescaped); the one script only adds keyboard shortcuts.

Access: reviewer keys are separate from proxy keys and compared in constant time; the session is a
signed cookie (HttpOnly, SameSite=Strict, Secure unless configured off) holding the reviewer, a random
session id and the session's end (`session_max_age_s` after login, however active). Logging out revokes
the id in the audit store, which every process serving the console reads, so a copy of the cookie is
refused from then on. Failed logins lock the client address out, and all addresses after many
(review/throttle.py). Every form, login and logout included, carries the session's CSRF token; pages
forbid framing, inline scripts and caching. URLs carry ids and filter names, never answer text.
"""

from __future__ import annotations

import asyncio
import csv
import hmac
import io
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from morphguard.config import ReviewSettings
from morphguard.policy.audit import AuditStore, parse_time
from morphguard.policy.reviews import LABELS, QueueFilter, ReviewStore, text_kept
from morphguard.review import charts
from morphguard.review.pages import answer_pieces, attach_evidence, claims_of, passage_pieces, passages_of
from morphguard.review.throttle import LoginThrottle

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
_FORM_LIMIT = 64_000
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_ROW_ID = re.compile(r"[0-9]{1,10}")
_MAX_ROW_ID = 2**31 - 1  # ids are INTEGER columns: 32 bits on PostgreSQL, where a larger number is an error
_FOREIGN_FORM = "This form has expired or did not come from this console; reload the page and try again."
_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}

Handler = Callable[[Request], Awaitable[Response]]


class ReviewConsole:
    """The console over an audit store; `store` is called per request, so a proxy can mount the console
    before its own store exists (the store is built in the proxy's lifespan)."""

    def __init__(self, settings: ReviewSettings, store: Callable[[], AuditStore | None],
                 reviewers: dict[str, str], topics: Sequence[str] = ()) -> None:
        self.settings = settings
        self.topics = sorted(topics)  # the configured topics, offered by the queue's filter
        self._store = store
        self.reviewers = reviewers
        self.throttle = LoginThrottle(settings)
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(
            default=True, default_for_string=True))

    def app(self) -> Starlette:
        secret = self.settings.session_secret.get_secret_value() if self.settings.session_secret \
            else secrets.token_urlsafe(32)  # sessions then end with the process
        return Starlette(
            routes=[
                Route("/login", self.login_page, methods=["GET"]),
                Route("/login", self.login, methods=["POST"]),
                Route("/logout", self._auth(self.logout), methods=["POST"]),
                Route("/", self.home, methods=["GET"]),
                Route("/queue", self._auth(self.queue), methods=["GET"]),
                Route("/decisions/{decision_id}", self._auth(self.detail), methods=["GET"]),
                Route("/decisions/{decision_id}/review", self._auth(self.review), methods=["POST"]),
                Route("/decisions/{decision_id}/take", self._auth(self.take), methods=["POST"]),
                Route("/decisions/{decision_id}/release", self._auth(self.release), methods=["POST"]),
                Route("/insights", self._auth(self.insights), methods=["GET"]),
                Route("/export.{kind:str}", self._auth(self.export), methods=["GET"]),
                Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
            ],
            middleware=[Middleware(SessionMiddleware, secret_key=secret, session_cookie="morphguard_review",
                                   max_age=self.settings.session_max_age_s, same_site="strict",
                                   https_only=self.settings.secure_cookies)],
            exception_handlers={404: self._not_found, 405: self._not_found, Exception: self._server_error},
        )

    # --- plumbing ---------------------------------------------------------------------------------------

    def _page(self, request: Request, template: str, status: int = 200, headers: dict[str, str] | None = None,
              **values: Any) -> HTMLResponse:
        session = request.session
        if "csrf" not in session:
            session["csrf"] = secrets.token_urlsafe(32)
        return self._html(request, template, status, headers, reviewer=session.get("reviewer"), csrf=session["csrf"],
                          **values)

    def _html(self, request: Request, template: str, status: int, headers: dict[str, str] | None = None,
              **values: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(base=request.scope.get("root_path", ""), **values)
        return HTMLResponse(html, status_code=status, headers={**_HEADERS, **(headers or {})})

    def _redirect(self, request: Request, path: str) -> RedirectResponse:
        return RedirectResponse(request.scope.get("root_path", "") + path, status_code=303, headers=_HEADERS)

    def _auth(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            if not await self._logged_in(request):
                if request.method == "GET":
                    return self._redirect(request, "/login")
                return self._page(request, "error.html", 403, message="Log in first.")
            if request.method == "POST":
                form = await self._form(request)
                if form is None or not _token_matches(request, form):
                    return self._page(request, "error.html", 403, message=_FOREIGN_FORM)
                request.state.form = form
            return await handler(request)
        return guarded

    async def _logged_in(self, request: Request) -> bool:
        """Whether the session is a reviewer's that has not ended: past its end, or revoked by logging out in
        any process. An ended session is cleared."""
        session = request.session
        if not session.get("reviewer"):
            return False
        alive = session.get("expires", 0) > time.time() and not await asyncio.to_thread(
            self._audit().session_revoked, session.get("sid", ""))
        if not alive:
            session.clear()
        return alive

    @staticmethod
    async def _form(request: Request) -> dict[str, str] | None:
        """The urlencoded form, or None when it is not one or exceeds the limit (read no further than that:
        the login form takes anyone's body)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > _FORM_LIMIT:
            return None
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > _FORM_LIMIT:
                return None
        try:
            fields = parse_qs(bytes(body).decode("utf-8"), keep_blank_values=True, max_num_fields=200)
        except (UnicodeDecodeError, ValueError):
            return None
        return {key: values[0] for key, values in fields.items()}

    def _audit(self) -> ReviewStore:
        store = self._store()
        if store is None:
            raise RuntimeError("the review console needs the audit store (policy.audit.enabled)")
        return ReviewStore(store)

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return self._page(request, "error.html", 404, message="No such page.")

    async def _server_error(self, request: Request, exc: Exception) -> Response:
        # Runs outside the session middleware (Starlette's outermost layer): a page without the session's parts.
        return self._html(request, "error.html", 500, reviewer=None, csrf="",
                          message="Something went wrong; the console's log has the details.")

    def _no_decision(self, request: Request) -> HTMLResponse:
        return self._page(request, "error.html", 404, message="No such decision.")

    # --- routes -----------------------------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        return self._page(request, "login.html")

    async def login(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None or not _token_matches(request, form):
            return self._page(request, "login.html", 403, error=_FOREIGN_FORM)
        address = request.client.host if request.client else ""
        wait = math.ceil(self.throttle.retry_after(address))
        if wait:
            return self._page(request, "login.html", 429, {"retry-after": str(wait)},
                              error=f"Too many failed logins; try again in {wait} seconds.")
        name, key = form.get("name", ""), form.get("key", "")
        if not self._valid(name, key):
            self.throttle.failed(address)
            log.warning("review console: failed login from %r", address)
            return self._page(request, "login.html", 401, error="Unknown reviewer or wrong key.")
        self.throttle.succeeded(address)
        request.session.clear()
        request.session.update({"reviewer": name, "csrf": secrets.token_urlsafe(32), "sid": secrets.token_urlsafe(24),
                                "expires": int(time.time()) + self.settings.session_max_age_s})
        return self._redirect(request, "/queue")

    def _valid(self, name: str, key: str) -> bool:
        matched = False
        for known, secret in self.reviewers.items():  # every key compared: no early exit on the right name
            matched |= hmac.compare_digest(known.encode(), name.encode()) & \
                hmac.compare_digest(secret.encode(), key.encode())
        return matched

    async def home(self, request: Request) -> Response:
        return self._redirect(request, "/queue")

    async def logout(self, request: Request) -> Response:
        session = request.session
        await asyncio.to_thread(self._audit().revoke_session, session["sid"], session["expires"])
        session.clear()
        return self._redirect(request, "/login")

    def _filter(self, request: Request) -> QueueFilter:
        q = request.query_params
        reviewed = {"yes": True, "no": False}.get(q.get("reviewed", ""))
        try:
            since = parse_time(q["since"]) if q.get("since") else None
            until = parse_time(q["until"]) if q.get("until") else None
        except ValueError:
            since = until = None
        assigned = q.get("assigned", "")
        assignee = request.session.get("reviewer") if assigned == "me" else "" if assigned == "nobody" else None
        return QueueFilter(topic=q.get("topic") or None, profile=q.get("profile") or None,
                           action=q.get("action") or None, since=since, until=until, reviewed=reviewed,
                           order="score" if q.get("order") == "score" else "newest",
                           text=q.get("q", "").strip()[:200] or None, assignee=assignee,
                           disagreed=q.get("shown") == "disagreed")

    async def queue(self, request: Request) -> Response:
        where = self._filter(request)
        after = request.query_params.get("after")
        if after and not re.fullmatch(r"[-+0-9.eE]{1,32}:[0-9]{1,18}", after):
            after = None
        rows, cursor = await asyncio.to_thread(self._audit().queue, where, after, self.settings.page_size)
        kept = {k: v for k, v in request.query_params.items() if k != "after" and v}
        return self._page(request, "queue.html", rows=rows, filters=kept, labels=LABELS,
                          next_url=("?" + urlencode({**kept, "after": cursor})) if cursor else None,
                          topics=self.topics, actions=_ACTIONS)

    async def detail(self, request: Request) -> Response:
        decision_id = _decision_id(request)
        if decision_id is None:
            return self._no_decision(request)
        store = self._audit()
        row = await asyncio.to_thread(store.decision, decision_id)
        if row is None:
            return self._no_decision(request)
        judgements = await asyncio.to_thread(store.judgements, decision_id)
        delivery = await asyncio.to_thread(store.delivery, row["request_id"]) if row["escalated"] else None
        newer, older = await asyncio.to_thread(store.neighbours, decision_id, QueueFilter(reviewed=False))
        assignee = await asyncio.to_thread(store.assignee, decision_id)
        kept = text_kept(row)
        passages = passages_of(row["context"]) if kept else []
        trace_url = None
        if self.settings.trace_url and row.get("trace_id") and _TRACE_ID.fullmatch(row["trace_id"]):
            trace_url = self.settings.trace_url.format(trace_id=row["trace_id"])
        # pure Python over the answer and the context: off the event loop
        claims, answer, marked = await asyncio.to_thread(_explained, row, passages, kept)
        return self._page(
            request, "detail.html", row=row, kept=kept, judgements=judgements, labels=LABELS,
            claims=claims, answer=answer, passages=marked, assignee=assignee,
            cost=row.get("cost") or {}, explanation=_steps(row), trace_url=trace_url, newer=newer, older=older,
            delivery=delivery,
            saved=request.query_params.get("saved") == "1")

    async def review(self, request: Request) -> Response:
        decision_id = _decision_id(request)
        if decision_id is None:
            return self._no_decision(request)
        form: dict[str, str] = request.state.form
        label = form.get("label", "")
        factoid_labels = {int(k[1:]): v for k, v in form.items() if re.fullmatch(r"f[0-9]{1,4}", k) and v}
        note = form.get("note", "")[:2000]
        store = self._audit()
        try:
            await asyncio.to_thread(store.judge, decision_id, request.session["reviewer"], label, factoid_labels,
                                    note)
        except KeyError:
            return self._no_decision(request)
        except ValueError:
            return self._page(request, "error.html", 400, message="Choose hallucinated, faithful or unsure.")
        _newer, older = await asyncio.to_thread(store.neighbours, decision_id, QueueFilter(reviewed=False))
        return self._redirect(request, f"/decisions/{older}?saved=1" if older else f"/decisions/{decision_id}?saved=1")

    async def take(self, request: Request) -> Response:
        """Assign the item to the reviewer asking, unless another reviewer has it."""
        decision_id = _decision_id(request)
        if decision_id is None:
            return self._no_decision(request)
        reviewer = request.session["reviewer"]
        try:
            holder = await asyncio.to_thread(self._audit().take, decision_id, reviewer)
        except KeyError:
            return self._no_decision(request)
        if holder != reviewer:
            return self._page(request, "error.html", 409, message=f"{holder} has taken this item already.")
        return self._redirect(request, f"/decisions/{decision_id}")

    async def release(self, request: Request) -> Response:
        decision_id = _decision_id(request)
        if decision_id is None:
            return self._no_decision(request)
        await asyncio.to_thread(self._audit().release, decision_id, request.session["reviewer"])
        return self._redirect(request, f"/decisions/{decision_id}")

    async def insights(self, request: Request) -> Response:
        store = self._audit()
        summary = await asyncio.to_thread(store.topic_summary)
        scores = await asyncio.to_thread(store.reviewed_scores)
        return self._page(request, "insights.html", summary=summary,
                          charts=[charts.flagged_rate(summary), charts.precision_over_time(scores),
                                  charts.score_distribution(scores)])

    async def export(self, request: Request) -> Response:
        kind = request.path_params["kind"]
        if kind not in ("jsonl", "csv"):
            return self._page(request, "error.html", 404, message="Export as .jsonl or .csv.")
        rows = await asyncio.to_thread(self._audit().export)
        if kind == "jsonl":
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            media = "application/x-ndjson"
        else:
            out = io.StringIO()
            writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["review_id"])
            writer.writeheader()
            for r in rows:
                writer.writerow({k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in r.items()})
            text, media = out.getvalue(), "text/csv"
        return Response(text, media_type=media, headers={
            **_HEADERS, "content-disposition": f'attachment; filename="morphguard-reviews.{kind}"'})


def _explained(row: dict[str, Any], passages: list[str], kept: bool) -> tuple[list[Any], list[Any], list[Any]]:
    """The row's claims (with their evidence where the text was kept), the answer's pieces and the passages'."""
    claims = claims_of(row["answer"] if kept else "", row["factoids"], bool(row["flagged"]))
    if not kept:
        return claims, [], []
    attach_evidence(claims, passages)
    return claims, answer_pieces(row["answer"], claims), passage_pieces(passages, claims)


def _decision_id(request: Request) -> int | None:
    """The decision id in the path; None when no row can have it (not digits, or too large for the database)."""
    text = request.path_params["decision_id"]
    return int(text) if _ROW_ID.fullmatch(text) and int(text) <= _MAX_ROW_ID else None


def _token_matches(request: Request, form: dict[str, str]) -> bool:
    """Whether the form carries the CSRF token this console gave this browser in its signed session cookie
    (GET /login gives one before anyone logs in). No cookie means no token, and an empty token matches nothing:
    a cross-site page can send neither."""
    issued = request.session.get("csrf", "")
    return bool(issued) and hmac.compare_digest(form.get("csrf", "").encode(), issued.encode())


_ACTIONS = ("annotate", "highlight", "cite", "regenerate", "block", "pass")


def reviewer_keys(settings: ReviewSettings) -> tuple[dict[str, str], str | None]:
    """The configured reviewers' keys; with none configured, one reviewer `local` with a fresh key, which
    `morphguard review` prints once (returned second)."""
    if settings.reviewers:
        return {name: key.get_secret_value() for name, key in settings.reviewers.items()}, None
    key = secrets.token_urlsafe(18)
    return {"local": key}, key


def _steps(row: dict[str, Any]) -> list[str]:
    """The lines that say how the decision's score came about (each a step with its score before and after)."""
    steps = row.get("explanation")
    return [str(step["text"]) for step in steps if isinstance(step, dict) and step.get("text")] \
        if isinstance(steps, list) else []
