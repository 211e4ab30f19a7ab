"""Tools executed for real on this host, in a scratch directory: shell, grep, pytest, sqlite, file reads.

Each catalog tool maps to a small real action of its kind, so tool phases cost real CPU time
and return real text; `ToolBox.run(name)` returns (output text, seconds).
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path

SOURCE = '''def parse(text):
    """Split a comma-separated line."""
    return [part.strip() for part in text.split(",") if part.strip()]


def total(values):
    return sum(float(v) for v in values)
'''
TEST = """from app import parse, total


def test_parse():
    assert parse("a, b,,c") == ["a", "b", "c"]


def test_total():
    assert total(["1", "2.5"]) == 3.5
"""
DOCS = {
    "remote_work.txt": "Remote work is allowed three days a week with manager approval.",
    "data_retention.txt": "Customer records are kept for seven years, logs for ninety days.",
    "travel_expenses.txt": "Economy class for flights under six hours; hotels up to 180 per night.",
    "security.txt": "Use hardware keys for production access; rotate secrets every quarter.",
}
SQL = {
    "search_flights": "SELECT * FROM flights WHERE price < 900 ORDER BY price LIMIT 5",
    "search_hotels": "SELECT * FROM hotels WHERE price < 200 ORDER BY stars DESC LIMIT 5",
    "run_sql": "SELECT region, COUNT(*), SUM(amount) FROM sales GROUP BY region ORDER BY 3 DESC",
    "lookup_order": "SELECT * FROM orders WHERE id = 'A10042'",
    "issue_refund": "UPDATE orders SET refunded = refunded + 1 WHERE id = 'A10042'",
    "update_address": "UPDATE orders SET city = 'Oslo' WHERE id = 'A10042'",
}
COMMANDS = {
    "bash": ["bash", "-c", "ls -la src tests && wc -l src/*.py && git --version || true"],
    "grep": ["grep", "-rn", "def ", "src", "tests"],
    "run_pytest": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
    "run_python": [
        sys.executable,
        "-c",
        "import statistics as s; d=[3,1,4,1,5,9,2,6]; print(s.mean(d), s.median(d), s.pstdev(d))",
    ],
}


class ToolBox:
    def __init__(self, scratch: str | Path):
        self.root = Path(scratch)
        self.db_path = self.root / "warehouse.sqlite"

    def setup(self) -> ToolBox:
        (self.root / "src").mkdir(parents=True, exist_ok=True)
        (self.root / "tests").mkdir(exist_ok=True)
        (self.root / "docs").mkdir(exist_ok=True)
        (self.root / "src" / "app.py").write_text(SOURCE)
        (self.root / "tests" / "test_app.py").write_text(TEST)
        (self.root / "tests" / "conftest.py").write_text("import sys; sys.path.insert(0, 'src')\n")
        for name, text in DOCS.items():
            (self.root / "docs" / name).write_text(text)
        self._setup_db()
        return self

    def _setup_db(self) -> None:
        with sqlite3.connect(self.db_path) as db:
            db.executescript("""
                DROP TABLE IF EXISTS flights; DROP TABLE IF EXISTS hotels; DROP TABLE IF EXISTS sales;
                DROP TABLE IF EXISTS orders;
                CREATE TABLE flights(origin, destination, price); CREATE TABLE hotels(city, name, price, stars);
                CREATE TABLE sales(region, amount); CREATE TABLE orders(id, city, refunded);""")
            db.executemany("INSERT INTO flights VALUES (?,?,?)", [("PAR", "TYO", 400 + 37 * i) for i in range(40)])
            db.executemany(
                "INSERT INTO hotels VALUES (?,?,?,?)", [("Oslo", f"H{i}", 90 + 7 * i, i % 5) for i in range(40)]
            )
            db.executemany(
                "INSERT INTO sales VALUES (?,?)", [(("north", "south", "east")[i % 3], i * 1.5) for i in range(3000)]
            )
            db.executemany("INSERT INTO orders VALUES (?,?,?)", [(f"A{10000 + i}", "Lima", 0) for i in range(100)])

    async def run(self, name: str) -> tuple[str, float]:
        started = time.perf_counter()
        if name in COMMANDS:
            output = await self._subprocess(COMMANDS[name])
        elif name in SQL:
            output = await asyncio.to_thread(self._sql, SQL[name])
        elif name == "edit_file":
            output = await asyncio.to_thread(self._edit)
        elif name == "search_docs":
            output = await asyncio.to_thread(self._read_docs)
        else:
            raise ValueError(f"no real action for tool '{name}': add one to driver/tools.py")
        return output, time.perf_counter() - started

    async def _subprocess(self, command: list[str]) -> str:
        process = await asyncio.create_subprocess_exec(
            *command, cwd=self.root, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        stdout, _ = await process.communicate()
        return stdout.decode(errors="replace")

    def _sql(self, query: str) -> str:
        with sqlite3.connect(self.db_path, timeout=30) as db:
            rows = db.execute(query).fetchall()
        return "\n".join(", ".join(str(v) for v in row) for row in rows) or "ok"

    def _edit(self) -> str:
        path = self.root / "src" / "app.py"
        lines = path.read_text().splitlines()
        lines[1] = '    """Split a comma-separated line (edited)."""'
        path.write_text("\n".join(lines) + "\n")
        return f"edited {path.name}: line 2"

    def _read_docs(self) -> str:
        return "\n".join(f"{p.name}: {p.read_text()}" for p in sorted((self.root / "docs").glob("*.txt")))
