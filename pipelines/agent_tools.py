"""The tools the catalog's agents may call (`TOOLS`): each an OpenAI function schema plus how long it runs on the
host CPU, which the synthetic sample (pipelines/synth.py), the simulator and the load driver draw tool times from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    """A tool an agent may call: an OpenAI function schema plus how long it runs on the host CPU."""

    name: str
    description: str
    parameters: dict
    kind: str  # search | bash | test | sql | python | file | api
    exec_s_mean: float  # mean host-CPU seconds per call (lognormal around it, see synth)

    def schema(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _obj(**props: str) -> dict:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": list(props)}


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        Tool(
            "search_flights",
            "Search flights between two airports on a date.",
            _obj(origin="string", destination="string", date="string", max_results="integer"),
            "search",
            1.2,
        ),
        Tool(
            "search_hotels",
            "Search hotels in a city for a date range.",
            _obj(city="string", check_in="string", check_out="string", max_price="number"),
            "search",
            1.0,
        ),
        Tool(
            "bash",
            "Run a shell command in the repository and return stdout/stderr.",
            _obj(command="string"),
            "bash",
            0.6,
        ),
        Tool("run_pytest", "Run the test suite or a subset of it.", _obj(path="string", k="string"), "test", 4.9),
        Tool("grep", "Search the repository for a pattern.", _obj(pattern="string", path="string"), "bash", 0.19),
        Tool(
            "edit_file",
            "Replace a span of lines in a file.",
            _obj(path="string", start_line="integer", end_line="integer", new_text="string"),
            "file",
            0.05,
        ),
        Tool(
            "search_docs",
            "Retrieve passages from the document index.",
            _obj(query="string", top_k="integer"),
            "search",
            0.4,
        ),
        Tool("run_sql", "Run a read-only SQL query against the warehouse.", _obj(query="string"), "sql", 0.8),
        Tool("run_python", "Execute a Python snippet in the analysis sandbox.", _obj(code="string"), "python", 2.5),
        Tool("lookup_order", "Fetch an order by id.", _obj(order_id="string"), "api", 0.15),
        Tool(
            "issue_refund",
            "Refund an order, fully or partially.",
            _obj(order_id="string", amount="number", reason="string"),
            "api",
            0.3,
        ),
        Tool(
            "update_address",
            "Change the shipping address of an order.",
            _obj(order_id="string", street="string", city="string", postcode="string"),
            "api",
            0.2,
        ),
    ]
}
