"""`python -m graphpool ...`: the same as the `graphpool` command."""

from graphpool.cli import main

raise SystemExit(main())
