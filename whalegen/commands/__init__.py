"""One module per `whalegen` subcommand: `add_arguments(parser)` and `run(args) -> int`."""
