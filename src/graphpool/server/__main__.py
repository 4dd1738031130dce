"""`python -m graphpool.server --port 8000 [engine flags]`."""

from graphpool.server.main import main

raise SystemExit(main())
