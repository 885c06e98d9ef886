"""``python -m fault_harness``: run named scenarios or a seed-driven random plan on a fresh cluster.

    python -m fault_harness --scenario NAME [--scenario NAME ...]   (or --scenario all)
    python -m fault_harness --random --seed S --epochs N
    options: --stack local|production, --report FILE (JSON, default faults-report.json),
             --keep (keep the cluster's temp dir)

Exit status 0 when every check passed (no anomaly, every action done), 1 otherwise. The report
prints the seed and the plan first, so any failure can be replayed with the same seed.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path

from fault_harness.cluster import cluster
from fault_harness.plans import describe_plan
from fault_harness.runner import run_scenarios
from fault_harness.scenarios import named_scenarios, random_plan, scenarios_for
from fault_harness.stacks import STACKS


def _stop_once(signum: int, _frame: object) -> None:
    """Unwind through the cluster's clean-up, ignoring later signals: ``pkill -f`` signals both
    ``uv run`` and this process, and a second signal during the teardown would leave the scheduler,
    the meta store's server and the databases behind (seen: a whole cluster left running)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(143)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", default=[], help="a named scenario, or 'all'")
    parser.add_argument("--random", action="store_true", help="a seed-driven random plan")
    parser.add_argument("--seed", type=int, default=None, help="the seed (default: a random one, printed)")
    parser.add_argument("--epochs", type=int, default=200, help="faulted epochs of the random plan")
    parser.add_argument("--per-pipeline", type=int, default=10, help="epochs per pipeline (DAG) of the random plan")
    parser.add_argument(
        "--no-upserts",
        action="store_true",
        help="no upsert pipelines in the random plan: a seed's plan as it was before they were added",
    )
    parser.add_argument(
        "--no-audits",
        action="store_true",
        help="no audited pipelines in the random plan: a seed's plan as it was before they were added",
    )
    parser.add_argument(
        "--stack",
        choices=STACKS,
        default="local",
        help="local: LocalExecutor, SQL catalog, local files; production: CeleryExecutor with two workers "
        "(Redis), SeaweedFS's Iceberg REST catalog and S3",
    )
    parser.add_argument("--parallelism", type=int, default=3, help="task slots (LocalExecutor, or the workers' total)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for the runs")
    parser.add_argument("--report", type=Path, default=Path("faults-report.json"))
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs) at the end")
    parser.add_argument("--list", action="store_true", help="list the named scenarios and exit")
    args = parser.parse_args(argv)

    # Tear the cluster down on SIGTERM and on Ctrl-C even when started in the background (where a
    # non-interactive shell leaves SIGINT ignored): both unwind through the cluster's clean-up.
    signal.signal(signal.SIGTERM, _stop_once)
    signal.signal(signal.SIGINT, _stop_once)
    known = named_scenarios()
    if args.list:
        for name, s in known.items():
            where = ", ".join(stack for stack in STACKS if name not in scenarios_for(stack, [name])[1])
            print(f"{name:34} [{where}] {s.description}")
        return 0
    if args.random == bool(args.scenario):
        parser.error("give --random or --scenario (one or more), not both, not neither")
    seed = None
    skipped: dict[str, str] = {}
    if args.random:
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
        scenarios = random_plan(
            seed,
            args.epochs,
            per_pipeline=args.per_pipeline,
            stack=args.stack,
            upserts=not args.no_upserts,
            audits=not args.no_audits,
        )
    else:
        names = list(known) if "all" in args.scenario else args.scenario
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown scenario(s) {unknown}; known: {sorted(known)}")
        scenarios, skipped = scenarios_for(args.stack, names)
        if "all" not in args.scenario and skipped:
            parser.error(f"not on the {args.stack} stack: {skipped}")
    plan = describe_plan(scenarios)
    print(json.dumps({"seed": seed, "stack": args.stack, "plan": plan, "skipped": skipped}, indent=1), flush=True)
    if seed is not None:
        print(
            f"seed {seed}: replay with scripts/faults --random --seed {seed} --epochs {args.epochs} --stack {args.stack}"
            + (f" --per-pipeline {args.per_pipeline}" if args.per_pipeline != 10 else "")
            + (" --no-upserts" if args.no_upserts else "")
            + (" --no-audits" if args.no_audits else ""),
            flush=True,
        )
    timeout = args.timeout or 600 + 40 * sum(s.epochs for s in scenarios)
    t0 = time.monotonic()
    report: dict[str, object] = {"seed": seed, "stack": args.stack, "plan": plan, "skipped": skipped}
    try:
        with cluster(keep_root=args.keep, parallelism=args.parallelism, stack=args.stack) as c:
            print(f"cluster in {c.root}", flush=True)
            report.update(run_scenarios(c, scenarios, timeout=timeout))
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["wall_seconds"] = round(time.monotonic() - t0, 1)
    args.report.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    summary = {
        k: report.get(k)
        for k in ("seed", "stack", "epochs", "faulted_epochs", "anomalies", "action_errors", "error", "wall_seconds")
    }
    print(json.dumps(summary), flush=True)
    for name, result in dict(report.get("scenarios") or {}).items():  # type: ignore[call-overload]
        for anomaly in result["anomalies"]:
            print(f"ANOMALY {name}: {anomaly}")
        if result["action_error"]:
            print(f"ACTION ERROR {name}: {result['action_error']}")
    ok = "error" not in report and report.get("anomalies") == 0 and report.get("action_errors") == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
