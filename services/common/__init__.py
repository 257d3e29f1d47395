"""What every Serentak service shares: config, DB, gRPC bootstrap, errors, logging, metrics."""
