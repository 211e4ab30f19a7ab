"""The workload catalog: multi-agent apps as DAGs of agent roles with tools.

Shared by the synthetic sample generator (pipelines/synth.py), the cluster simulator and the load
driver. Each app says whether it is interactive, which roles it has (with system prompt, tools and
an output model), and how one request unfolds into stages (`App.stages`). The shapes of an app are in
app_spec.py; the tools its roles call (`TOOLS`) in agent_tools.py.
"""

from __future__ import annotations

from pipelines.app_spec import App, Role, StageSpec


def _roles(*roles: Role) -> dict[str, Role]:
    return {r.name: r for r in roles}


APPS: dict[str, App] = {
    a.name: a
    for a in [
        App(
            "travel_planner",
            True,
            _roles(
                Role(
                    "requirements_analyst",
                    "You are the requirements analyst of a travel agency. Extract the "
                    "traveller's constraints (cities, dates, budget, preferences) as structured JSON.",
                    text_base_tokens=90,
                    tokens_per_item=8,
                ),
                Role(
                    "flight_agent",
                    "You are a flight search agent. Use the search_flights tool to find options, "
                    "then recommend the best ones.",
                    ("search_flights",),
                    0.9,
                    120,
                    45,
                    0.15,
                ),
                Role(
                    "hotel_agent",
                    "You are a hotel recommendation agent. Use search_hotels, then recommend "
                    "hotels that fit the budget and preferences.",
                    ("search_hotels",),
                    0.9,
                    120,
                    55,
                    0.15,
                ),
                Role(
                    "itinerary_planner",
                    "You are the itinerary planner. Combine flights, hotels and the "
                    "traveller's wishes into a day-by-day itinerary.",
                    text_base_tokens=220,
                    tokens_per_item=110,
                    digest_ratio=0.1,
                ),
            ),
            (
                StageSpec("analyse", "requirements_analyst"),
                StageSpec("flights", "flight_agent", ("analyse",), 2),
                StageSpec("hotels", "hotel_agent", ("analyse",), 2),
                StageSpec("plan", "itinerary_planner", ("flights", "hotels")),
            ),
            (
                "a {days}-day trip from {city_a} to {city_b} for {people} people with a budget of ${budget}",
                "a family holiday in {city_b} for {days} days, leaving from {city_a}",
                "a business trip from {city_a} to {city_b}, {days} days, close to the convention centre",
            ),
            slo_s=30.0,
            models=("llama-3-8b", "qwen2-7b"),
        ),
        App(
            "swe_coding",
            False,
            _roles(
                Role(
                    "coder",
                    "You are a software engineer working in a git repository. Use the tools to "
                    "inspect code, edit files and run tests until the issue is fixed. Reply with a tool call "
                    "or, when done, a summary of the patch.",
                    ("bash", "run_pytest", "grep", "edit_file"),
                    0.88,
                    160,
                    25,
                    0.05,
                ),
                Role(
                    "reviewer",
                    "You review patches. Point out bugs, missing tests and style problems, then give a verdict.",
                    text_base_tokens=260,
                    tokens_per_item=60,
                    digest_ratio=0.2,
                ),
            ),
            (StageSpec("fix", "coder", (), 12), StageSpec("review", "reviewer", ("fix",))),
            (
                "fix the failing test in {module} where {symptom}",
                "implement {feature} in {module} and add tests",
                "the {module} module raises {error} when {symptom}; find and fix the cause",
            ),
            slo_s=600.0,
            models=("qwen2.5-coder-32b",),
        ),
        App(
            "rag_qa",
            True,
            _roles(
                Role(
                    "query_planner",
                    "You plan retrieval. Call search_docs with focused queries for the user's question.",
                    ("search_docs",),
                    0.95,
                    60,
                    10,
                ),
                Role(
                    "reader",
                    "You read retrieved passages and write concise notes of what is relevant.",
                    text_base_tokens=80,
                    tokens_per_item=20,
                    digest_ratio=0.25,
                ),
                Role(
                    "answerer",
                    "You answer the user's question from the notes, citing sources.",
                    text_base_tokens=150,
                    tokens_per_item=70,
                    digest_ratio=0.3,
                ),
            ),
            (
                StageSpec("plan", "query_planner", (), 1),
                StageSpec("read", "reader", ("plan",)),
                StageSpec("answer", "answerer", ("read",)),
            ),
            (
                "what does our policy say about {topic}?",
                "compare {topic} across the last {items} reports",
                "summarise everything we know about {topic}",
            ),
            slo_s=15.0,
            models=("llama-3-8b",),
        ),
        App(
            "data_analysis",
            False,
            _roles(
                Role(
                    "analysis_planner",
                    "You plan a data analysis: list the questions to answer and the data needed, as a numbered plan.",
                    text_base_tokens=140,
                    tokens_per_item=35,
                ),
                Role(
                    "sql_agent",
                    "You write SQL against the warehouse schema with run_sql and explain results.",
                    ("run_sql",),
                    0.85,
                    110,
                    30,
                    0.1,
                ),
                Role(
                    "python_analyst",
                    "You analyse query results with run_python (pandas, matplotlib).",
                    ("run_python",),
                    0.75,
                    180,
                    40,
                    0.1,
                ),
                Role(
                    "report_writer",
                    "You write the final analysis report with findings, charts and caveats.",
                    text_base_tokens=350,
                    tokens_per_item=140,
                    digest_ratio=0.15,
                ),
            ),
            (
                StageSpec("plan", "analysis_planner"),
                StageSpec("query", "sql_agent", ("plan",), 3),
                StageSpec("analyse", "python_analyst", ("query",), 3),
                StageSpec("report", "report_writer", ("analyse",)),
            ),
            (
                "analyse {metric} by {dimension} over the last {items} quarters",
                "find why {metric} dropped in {dimension} and propose fixes",
                "build a weekly report of {metric} for the {dimension} team",
            ),
            slo_s=900.0,
            models=("qwen2-72b",),
        ),
        App(
            "customer_support",
            True,
            _roles(
                Role(
                    "triage",
                    "Classify the customer's message into one of: refund, address_change, "
                    "order_status, complaint, other. Answer in JSON.",
                    text_base_tokens=18,
                ),
                Role(
                    "support_agent",
                    "You are a customer-support agent with access to order tools. Resolve "
                    "the customer's request using the tools.",
                    ("lookup_order", "issue_refund", "update_address"),
                    0.85,
                    90,
                    15,
                    0.1,
                ),
                Role(
                    "responder",
                    "Write the reply to the customer: polite, specific, and short unless they asked for details.",
                    text_base_tokens=110,
                    tokens_per_item=30,
                    digest_ratio=0.1,
                ),
                Role(
                    "ticket_summarizer",
                    "Summarise the ticket for the CRM in at most three sentences.",
                    text_base_tokens=60,
                    digest_ratio=0.05,
                ),
            ),
            (
                StageSpec("triage", "triage"),
                StageSpec("resolve", "support_agent", ("triage",), 3),
                StageSpec("reply", "responder", ("resolve",)),
                StageSpec("summary", "ticket_summarizer", ("reply",)),
            ),
            (
                "my order {order} has not arrived after {days} days",
                "please refund {items} items from order {order}, they arrived broken",
                "change the delivery address of order {order} to {city_b}",
            ),
            slo_s=10.0,
            models=("llama-3-8b", "mistral-7b"),
        ),
    ]
}


def get_app(name: str) -> App:
    """Look up an app by name; the error lists what exists."""
    try:
        return APPS[name]
    except KeyError:
        raise ValueError(f"unknown app '{name}'; known apps: {', '.join(sorted(APPS))}") from None
