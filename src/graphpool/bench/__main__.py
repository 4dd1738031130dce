"""`python -m graphpool.bench step|memory|trace ...` (the same as `graphpool bench ...`)."""

from graphpool.bench.cli import main

raise SystemExit(main())
