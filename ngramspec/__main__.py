"""`python -m ngramspec rewrite|summarize ...` (same as the `ngramspec` command)."""

from .app.cli import main

raise SystemExit(main())
