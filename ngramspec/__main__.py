"""`python -m ngramspec rewrite|summarize ...` (same as the `ngramspec` command)."""

from .cli import main

raise SystemExit(main())
