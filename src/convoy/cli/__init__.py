"""Command-line interface: one module per command, each with add_arguments(parser) and run(args)."""
