"""`python -m graphpool`: the `graphpool` command."""

from graphpool.cli import main

raise SystemExit(main())
