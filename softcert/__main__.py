"""``python -m softcert`` = ``softcert``."""
from softcert.cli import main

raise SystemExit(main())
