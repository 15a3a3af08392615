"""``python -m softcert_cli`` = ``softcert``."""
from softcert_cli import main

raise SystemExit(main())
