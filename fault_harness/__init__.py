"""The fault-injection harness: a real Airflow deployment, faults at named points, tables judged
from their input alone (docs/faults.md). Outside the package and the tests so the benchmarks can
use its deployment too; never shipped in the wheel."""
