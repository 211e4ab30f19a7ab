"""The referee's whole grid on one side: every scenario (mars-swe in its medium and long regimes), one referee process
each, `--jobs` at a time, the longest first; each writes its own report (JSON, table, plot) and `index.md` puts
Maestro against the scenario's best baseline at every load beside each run's wall time.

    python -m benchmarks.referee.grid_all --side locked --seeds 3 --model DIR --work DIR --out DIR [--jobs 2]
    python -m benchmarks.referee.grid_all --folds family --seeds 3 --work DIR --out DIR [--jobs 2]

With `--folds family` every scenario is judged leaving one app family out at a time (the referee's `--folds family`:
each family replayed with the predictor trained on the others, at rates found per fold); the index has the pooled
figures by load (light, knee, past, heavy) and each family's at its own rates. The folds' predictors are trained once,
before the scenarios' processes start (they share `--work`); `--model` is refused: it saw every family.

Each scenario runs the baselines as users run them (max-len `fcfs`, `edf`, `srtf`; stock vLLM in FCFS and deadline
order), the scenario's own extra baselines and Maestro fed each of the four prediction sources, at the rates the
referee finds (`--rates auto`), on the number of workflows its runs have used (`GRID`: what a run's intervals need
and the two cores allow; mars-swe's long contexts make each workflow dear). `--arms`, `--workflows`, `--rates` and
`--nodes` override every scenario's (a quick look, or a test); `--lean` keeps of the default arms EDF, stock vLLM, the
scenario's own baselines and Maestro fed the model and nothing (for the folds, which cost five times a side).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks.referee.arms import BASELINES, STOCK
from serving.sim.scenarios import get_scenario

SOURCES = tuple(f"maestro[{source}]" for source in ("model", "prior", "none", "oracle"))
LEAN = ("edf", *STOCK, "maestro[model]", "maestro[none]")  # `--lean`: five folds make every arm five times dearer


@dataclass(frozen=True)
class GridRun:
    scenario: str
    regime: str | None
    workflows: int

    @property
    def name(self) -> str:
        return self.scenario + (f"-{self.regime}" if self.regime else "")

    def arms(self, lean: bool = False) -> str:
        """The baselines, the scenario's extra ones, Maestro fed each source; `lean`: of the baselines only EDF and
        stock vLLM (FCFS, deadline order), and Maestro fed the model and nothing (`LEAN`)."""
        extra = get_scenario(self.scenario, 8, regime=self.regime).referee_arms
        if lean:
            return ",".join(dict.fromkeys(LEAN[:3] + tuple(extra) + LEAN[3:]))
        return ",".join(dict.fromkeys(BASELINES + STOCK + tuple(extra) + SOURCES))


# the longest first (on two cores the last to start should be short); workflows as the locked runs have used
GRID = (
    GridRun("mixed-class", None, 1600),
    GridRun("maestro-paper", None, 1600),
    GridRun("mars-swe", "long", 400),
    GridRun("mars-swe", "medium", 400),
    GridRun("multi-model", None, 800),
)


def split_args(args: argparse.Namespace) -> list[str]:
    """Which workflows a process replays: one side, or every family left out in turn."""
    return ["--folds", args.folds] if args.folds else ["--side", args.side]


def command(run: GridRun, args: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.referee", "--scenario", run.scenario, *split_args(args)]
    cmd += ["--seeds", str(args.seeds), "--rates", args.rates, "--nodes", str(args.nodes), "--work", args.work]
    cmd += ["--workflows", str(args.workflows or run.workflows), "--arms", args.arms or run.arms(args.lean)]
    cmd += ["--regime", run.regime] if run.regime else []
    cmd += ["--model", args.model] if args.model else []
    return cmd + ["--json", str(out / f"{run.name}.json")]


def run_one(run: GridRun, args: argparse.Namespace, out: Path) -> float | None:
    """One scenario's referee process; its output goes to `<name>.log`. Returns its wall seconds, None where it failed
    (the other scenarios go on)."""
    started = time.perf_counter()
    print(f"[grid] {run.name}: started", flush=True)
    with open(out / f"{run.name}.log", "w") as log:
        done = subprocess.run(command(run, args, out), stdout=log, stderr=subprocess.STDOUT, check=False)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        print(f"[grid] {run.name}: the referee failed (exit {done.returncode}); see {out / run.name}.log", flush=True)
        return None
    print(f"[grid] {run.name}: done in {wall_s / 60:.1f} min", flush=True)
    return wall_s


def best_baseline(results: dict, differences: dict, challenger: str = "maestro[model]") -> tuple[str, dict | None]:
    """The arm with the highest attainment among the baselines at one rate, and the challenger's paired difference
    from it where the referee reports one (mean only where it does not)."""
    baselines = [a for a in results if a != "ceiling" and not a.startswith("maestro[") and a != "edf+admission"]
    best = max(baselines, key=lambda a: results[a]["slo_attainment"]["mean"])
    paired = differences.get(f"{challenger} - {best}")
    if paired is not None:
        return best, paired["slo_attainment"]
    mean = results[challenger]["slo_attainment"]["mean"] - results[best]["slo_attainment"]["mean"]
    return best, {"mean": mean, "lo": None, "hi": None}


def pp(stat: dict | None) -> str:
    if stat is None:
        return "–"
    text = f"{100 * stat['mean']:+.1f}"
    return text + (f" [{100 * stat['lo']:+.1f}, {100 * stat['hi']:+.1f}]" if stat["lo"] is not None else "")


def rate_label(rate: str) -> str:
    """A load as the report keys it: a rate in workflows/s, or a pooled figure's load name (light, knee, …)."""
    try:
        return f"{float(rate):g}"
    except ValueError:
        return rate


def sections(report: dict) -> list[tuple[str, dict]]:
    """The figures of one scenario's report: a side's alone; with folds, the pooled ones and then each family's."""
    if not report.get("folds"):
        return [("", report)]
    return [("pooled", report)] + [(fold["split"], fold) for fold in report["folds"]]


def index(out: Path, walls: dict[str, float | None], total_s: float, side: str) -> str:
    """The grid's summary: per scenario (and left-out family) and load, the best baseline, Maestro (model) − it,
    model − none; a scenario's report left in `out` by an earlier invocation is indexed too (no wall), a failed one
    named."""
    lines = [
        f"# The referee's grid, {side}",
        "",
        f"Whole grid: {total_s / 60:.1f} min wall. Maestro fed the model (else the first source run) against the best"
        " baseline at each load (pp, 95 % interval over seeds and workflows where the referee pairs the two), and the"
        " model against no prediction. Each scenario's own report: `<scenario>.md`.",
        "",
        "| scenario | fold | rate (/s) | best baseline | its SLO | Maestro − best (pp) | model − none (pp) "
        "| wall (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in GRID:
        path = out / f"{run.name}.json"
        if walls.get(run.name, 0.0) is None or not path.exists():
            continue
        wall = f"{walls[run.name] / 60:.1f}" if run.name in walls else "–"
        for fold, figures in sections(json.loads(path.read_text())):
            for rate, results in figures["results"].items():
                differences = figures["differences"][rate]
                challenger = next((a for a in SOURCES if a in results), None)
                if challenger is None:
                    continue
                best, diff = best_baseline(results, differences, challenger)
                none = differences.get("maestro[model] - maestro[none]")
                slo = results[best]["slo_attainment"]["mean"]
                lines.append(
                    f"| {run.name} | {fold or '–'} | {rate_label(rate)} | {best} | {slo:.3f} | {pp(diff)} | "
                    f"{pp(none['slo_attainment'] if none else None)} | {wall} |"
                )
                wall = ""
    failed = [name for name, wall_s in walls.items() if wall_s is None]
    lines += ["", f"Failed (see `<scenario>.log`): {', '.join(failed)}."] if failed else []
    return "\n".join(lines) + "\n"


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--side", default="dev", choices=("dev", "locked"))
    add("--folds", choices=("family",), help="leave one app family out at a time, in every scenario (not a side)")
    add("--seeds", type=int, default=3)
    add("--jobs", type=int, default=2, help="referee processes at a time (one core each)")
    add("--model", help="a trained predictor directory (default: each process trains or reuses one in --work)")
    add("--work", default="benchmarks/results/referee", help="splits and models, shared by the processes")
    add("--out", default="benchmarks/results/referee_grid", help="each scenario's report, the logs, index.md")
    add("--rates", default="auto")
    add("--arms", help="every scenario's arms (default: the baselines, its extra ones, the four sources)")
    add("--lean", action="store_true", help="default arms: EDF, stock vLLM, the scenario's own, Maestro[model|none]")
    add("--workflows", type=int, help="every scenario's workflows (default: `GRID`'s)")
    add("--nodes", type=int, default=8)
    add("--scenarios", help=f"comma-separated, of {', '.join(r.name for r in GRID)} (default: all)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = parser_of()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.folds and args.model:
        parser.error("--model with --folds: that predictor saw every family; leave --model out to train one per fold")
    label = f"{args.folds} folds" if args.folds else f"{args.side} side"
    names = args.scenarios.split(",") if args.scenarios else [r.name for r in GRID]
    if unknown := sorted(set(names) - {r.name for r in GRID}):
        parser.error(f"--scenarios: unknown {', '.join(unknown)}; known: {', '.join(r.name for r in GRID)}")
    runs = [r for r in GRID if r.name in names]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.model and any(a.startswith(SOURCES[:2]) for a in (args.arms or SOURCES[0]).split(",")):
        # the processes would each train the same predictors at once: train them here first, they reuse them
        warm = [sys.executable, "-m", "benchmarks.referee", *split_args(args), "--seeds", "1", "--rates", "1"]
        warm += ["--workflows", "4", "--arms", "maestro[model]", "--work", args.work, "--json", str(out / "warm.json")]
        subprocess.run(warm, check=True, stdout=subprocess.DEVNULL)
        for suffix in (".json", ".md", ".png"):
            (out / "warm").with_suffix(suffix).unlink(missing_ok=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        walls = dict(zip((r.name for r in runs), pool.map(lambda run: run_one(run, args, out), runs)))
    total_s = time.perf_counter() - started
    (out / "index.md").write_text(index(out, walls, total_s, label))
    side = None if args.folds else args.side
    grid = {"side": side, "folds": args.folds, "wall_s": round(total_s, 1), "runs": walls}
    (out / "grid.json").write_text(json.dumps(grid))
    print(f"[grid] whole grid in {total_s / 60:.1f} min; wrote {out / 'index.md'}")
    if failed := [name for name, wall_s in walls.items() if wall_s is None]:
        raise SystemExit(f"[grid] failed: {', '.join(failed)} (see their logs in {out})")


if __name__ == "__main__":
    main()
