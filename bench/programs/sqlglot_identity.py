"""sqlglot transpiling its own test fixture (bench/data/sqlglot_identity.sql, one statement a line) to three
dialects: trace0's headline workload, a recursive-descent parser and a code generator, pure Python."""

import logging
import os
import sys

import sqlglot

logging.getLogger("sqlglot").setLevel(logging.CRITICAL)  # unsupported-feature warnings, not errors
FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sqlglot_identity.sql")

statements = failed = 0
with open(FIXTURE, encoding="utf-8") as f:
    lines = [line for line in f.read().splitlines() if line.strip()]
for line in lines:
    for dialect in ("postgres", "duckdb", "bigquery"):
        try:
            statements += len(sqlglot.transpile(line, write=dialect))
        except Exception:  # the fixture holds statements this version rejects, or fails on (a ValueError)
            failed += 1
print(f"{statements} statements, {failed} not transpiled", file=sys.stderr)
