"""One module per ``softcert`` subcommand, each with ``configure(parser)`` and ``run(args)``.

They parse options, call the library (bounds, kernels, analysis, certify), write the
Markdown, JSON and figures through softcert.cli.common, and time; the map from subcommand
names to these modules is softcert.cli.SUBCOMMANDS.
"""
